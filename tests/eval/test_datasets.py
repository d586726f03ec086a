"""Dataset loaders: GSM8K, MATH-500, HumanEval, custom JSONL, and the dispatch by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from refinery.eval.datasets import (
    DatasetError,
    load_dataset,
    load_gsm8k,
    load_humaneval,
    load_jsonl,
    load_math500,
    parse_fields,
)

ROOT = Path(__file__).resolve().parents[2]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- GSM8K


def test_gsm8k_local_test_split() -> None:
    exs = load_gsm8k()
    assert len(exs) == 1319
    assert len({e.id for e in exs}) == 1319
    assert exs[0].gold == "18" and exs[0].verifier == "math" and exs[0].dataset == "gsm8k"
    assert all("," not in e.gold and "####" not in e.gold and e.gold for e in exs)
    # the reference solution is private: the Task a strategy sees has no trace of it
    task = exs[0].to_task()
    assert task.question == exs[0].prompt
    blob = task.model_dump_json()
    assert "####" not in blob and "solution" not in task.metadata
    assert exs[0].private["solution"].endswith("#### 18")
    assert "#### 18" in json.dumps(exs[0].verify_task().metadata)
    assert [e.id for e in load_gsm8k(limit=5)] == [e.id for e in exs[:5]]


def test_gsm8k_env_override_and_missing_path(tmp_path, monkeypatch) -> None:
    _jsonl(tmp_path / "test.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"},
                                     {"question": "Big?", "answer": "#### 1,234"}])
    monkeypatch.setenv("REFINERY_GSM8K", str(tmp_path))
    exs = load_gsm8k()
    assert [e.gold for e in exs] == ["2", "1234"]
    with pytest.raises(DatasetError, match="does not exist"):
        load_gsm8k(data_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DatasetError, match="does not exist"):
        load_gsm8k("train")  # the override dir has no train.jsonl


def test_hub_offline_gives_a_clear_error(tmp_path) -> None:
    # No local MATH-500 here, so the loader goes to the hub; offline that must be a
    # DatasetError that says what to do. A subprocess: `datasets` reads the offline
    # switches once, at import.
    code = ("from refinery.eval.datasets import load_math500, DatasetError\n"
            "try:\n    load_math500(limit=1)\nexcept DatasetError as e:\n"
            "    print('DatasetError:', e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "REFINERY_MATH500": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=90)
    assert "DatasetError:" in out.stdout, out.stderr[-2000:]
    assert "HuggingFaceH4/MATH-500" in out.stdout and "REFINERY_MATH500" in out.stdout


def test_math500_from_local_jsonl(tmp_path) -> None:
    path = _jsonl(tmp_path / "test.jsonl", [
        {"problem": "What is $1/2+1/2$?", "solution": "It is $\\boxed{1}$.", "answer": "1",
         "subject": "Algebra", "level": 1, "unique_id": "test/algebra/1.json"},
        {"problem": "Simplify $\\frac{2}{4}$.", "solution": "So $\\boxed{\\frac{1}{2}}$.",
         "subject": "Prealgebra", "level": "Level 3", "unique_id": "test/prealgebra/7.json"}])
    exs = load_math500(data_path=str(path))
    assert [e.gold for e in exs] == ["1", "\\frac{1}{2}"]  # missing answer -> last \boxed{}
    assert [e.level for e in exs] == [1, 3]
    assert exs[1].id == "test/prealgebra/7.json" and exs[1].metadata["subject"] == "Prealgebra"
    assert "boxed" not in exs[1].to_task().model_dump_json()


# -------------------------------------------------------------------------- HumanEval


def test_humaneval_bundled_problems_hide_their_tests() -> None:
    exs = load_humaneval()
    assert len(exs) == 164 and exs[0].id == "HumanEval/0"
    assert all(e.verifier == "code" for e in exs)
    e = exs[0]
    assert "def has_close_elements" in e.prompt
    assert "def check(" in e.private["tests"] and e.private["entry_point"] == e.metadata[
        "entry_point"]
    assert "def check(" not in e.to_task().model_dump_json()
    assert "def check(" in e.verify_task().metadata["tests"]


# ----------------------------------------------------------------------------- custom


def test_custom_jsonl_field_mapping(tmp_path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [
        {"qid": "a", "question": "2+3?", "answer": "5", "meta": {"lvl": 2}, "note": "x"},
        {"qid": "b", "question": "7-1?", "answer": "6", "meta": {"lvl": "Level 4"}}])
    exs = load_dataset(str(path), fields=parse_fields(
        ["prompt=question", "gold=answer", "id=qid", "level=meta.lvl"]))
    assert [(e.id, e.prompt, e.gold, e.level) for e in exs] == [
        ("a", "2+3?", "5", 2), ("b", "7-1?", "6", 4)]
    assert exs[0].dataset == "qa" and exs[0].verifier == "math"
    assert exs[0].private == {"note": "x"}
    assert "5" not in exs[0].to_task().model_dump_json()
    # default ids are file stem + line; the verifier can be chosen
    exs = load_jsonl(path, fields={"prompt": "question", "gold": "answer"}, verifier="exact")
    assert [e.id for e in exs] == ["qa-1", "qa-2"]
    assert exs[0].verifier == "exact"


def test_custom_jsonl_errors(tmp_path) -> None:
    path = _jsonl(tmp_path / "qa.jsonl", [{"question": "2+3?", "answer": "5"},
                                          {"question": "7-1?"}])
    with pytest.raises(DatasetError, match=r"qa.jsonl:1: no column 'prompt'"):
        load_jsonl(path)
    with pytest.raises(DatasetError, match=r"qa.jsonl:2: no column 'answer' for 'gold'"):
        load_jsonl(path, fields={"prompt": "question", "gold": "answer"})
    with pytest.raises(DatasetError, match="EXAMPLE_FIELD=COLUMN"):
        parse_fields(["prompt"])
    with pytest.raises(DatasetError, match="unknown field"):
        parse_fields(["answer=gold"])
    dup = _jsonl(tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a", "gold": "1"},
                                          {"id": 1, "prompt": "b", "gold": "2"}])
    with pytest.raises(DatasetError, match="duplicate id"):
        load_jsonl(dup)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "gold": "1"}\nnot json\n')
    with pytest.raises(DatasetError, match="bad.jsonl:2"):
        load_jsonl(tmp_path / "bad.jsonl")
    with pytest.raises(DatasetError, match="unknown dataset 'gsm9k'"):
        load_dataset("gsm9k")
    with pytest.raises(DatasetError, match="custom"):
        load_dataset("gsm8k", fields={"prompt": "q"})
