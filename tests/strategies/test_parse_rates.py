"""scripts/parse_rates.py counts the parse notes of traces written by scripted runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from refinery import strategies
from refinery.engine.run import run
from refinery.engine.trace import TraceWriter
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import task
from tests.strategies.test_ssr import rules

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("parse_rates",
                                                  ROOT / "scripts" / "parse_rates.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


async def _write_run(out: Path, spec: str, backend: ScriptedBackend, tasks: int = 2) -> None:
    writer = TraceWriter(out / "traces.jsonl")
    batch = [task().model_copy(update={"id": f"t{i}"}) for i in range(tasks)]
    await run(strategies.build(spec), batch, backend, trace_writer=writer)


async def test_counts_per_strategy_step_and_mode(tmp_path, capsys):
    pr = _script()
    await _write_run(tmp_path / "free", "ssr(max_iter=0, structured=False)",
                     ScriptedBackend(rules(decompose="no JSON here")))
    await _write_run(tmp_path / "on", "ssr(max_iter=0)", ScriptedBackend(rules()))
    free = pr.count([tmp_path / "free"])
    # 2 tasks x 2 assessments: every decomposition and its retry fail, then the judge
    # of each self-refine parses ("Score: 5")
    assert free == {("ssr", "decompose", "free"): [0, 4],
                    ("ssr", "decompose_retry", "free"): [0, 4],
                    ("ssr", "judge", "free"): [2, 2]}
    on = pr.count([tmp_path / "on" / "traces.jsonl"])
    assert on[("ssr", "decompose", "structured")] == [4, 4]
    # per assessment 2 steps x 5 re-solves; in each, one sample of step 1 is untagged
    assert on[("ssr", "resolve", "structured")] == [36, 40]
    both = pr.count([tmp_path / "free", tmp_path / "on"])
    assert both == {**free, **on}
    assert pr.main([str(tmp_path / "on")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["strategy", "step", "mode", "parsed/total", "rate"]
    assert any(line.split() == ["ssr", "resolve", "structured", "36/40", "90.0%"]
               for line in out.splitlines())
    assert pr.main([str(tmp_path / "free"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"strategy": "ssr", "step": "judge", "mode": "free", "parsed": 2, "total": 2,
            "rate": 1.0} in rows


def test_verdicts_torn_lines_and_missing_paths(tmp_path, capsys):
    pr = _script()
    event = {"strategy": "dei", "data": {"parse": {"step": "review", "parsed": [True, False],
                                                  "structured": True}}}
    (tmp_path / "traces.jsonl").write_text(
        json.dumps({"events": [event, {"strategy": "cot", "data": {}}]}) + "\n{torn")
    verdict = {"parsed": [False], "structured": False}
    (tmp_path / "results.jsonl").write_text(
        json.dumps({"verdict": verdict}) + "\n" + json.dumps({"verdict": {"x": 1}}) + "\n")
    assert pr.count([tmp_path]) == {("dei", "review", "structured"): [1, 2],
                                    ("verifier", "judge", "free"): [0, 1]}
    with pytest.raises(FileNotFoundError):
        pr.count([tmp_path / "nope"])
    assert pr.main([str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert "no parse records" in pr.table({})
