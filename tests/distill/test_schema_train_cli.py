"""Row schemas, training input checks (no model work) and weights.

The ``refinery distill`` commands' tests are tests/refinery/cli/test_distill.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest
from pydantic import ValidationError

from refinery.distill.schema import (
    DistillError,
    example_provenance,
    read_rows,
    validate_pair_row,
    validate_sft_row,
    write_rows,
)
from refinery.distill.train import default_threads, expand_weights, free_cores, train
from tests.waiting import wait_until

USER = {"role": "user", "content": "2 + 2?"}
GOOD = {"role": "assistant", "content": "2 + 2 = 4. \\boxed{4}"}


def sft_row(**changes) -> dict:
    row = {"messages": [USER, GOOD], "metadata": example_provenance()}
    row.update(changes)
    return row


def pair_row(**changes) -> dict:
    row = {"prompt": [USER], "chosen": [GOOD],
           "rejected": [{"role": "assistant", "content": "2 + 2 = 5. \\boxed{5}"}],
           "metadata": example_provenance(pair=True)}
    row.update(changes)
    return row


@pytest.mark.parametrize("bad", [
    sft_row(messages=[USER, {"role": "assistant", "content": "<evaluation>x</evaluation> 4"}]),
    sft_row(messages=[USER, {"role": "assistant", "content": "so <answer>4</answer>"}]),
    sft_row(messages=[USER, {"role": "assistant", "content": "4<|im_end|>"}]),
    sft_row(messages=[USER, {"role": "assistant", "content": "   "}]),
    sft_row(messages=[GOOD, USER]),  # ends with the user
    sft_row(messages=[GOOD]),
    sft_row(metadata=example_provenance(weight=0)),
    sft_row(metadata={k: v for k, v in example_provenance().items() if k != "verifier"}),
    sft_row(metadata=example_provenance(gold="4")),  # no unknown (e.g. gold) fields
    sft_row(extra="field"),
])
def test_schema_rejects_bad_sft_rows(bad) -> None:
    with pytest.raises(ValidationError):
        validate_sft_row(bad)


@pytest.mark.parametrize("bad", [
    pair_row(rejected=[GOOD]),  # chosen == rejected
    pair_row(rejected=[{"role": "assistant", "content": " 2 + 2 = 4.  \\boxed{4} "}]),
    pair_row(chosen=[GOOD, GOOD]),
    pair_row(prompt=[USER, GOOD]),
    pair_row(metadata=example_provenance()),  # no pair fields
    pair_row(metadata=example_provenance(pair=True, pair_source="vibes")),
])
def test_schema_rejects_bad_pair_rows(bad) -> None:
    with pytest.raises(ValidationError):
        validate_pair_row(bad)


def test_good_rows_validate_and_write_refuses_a_bad_one(tmp_path) -> None:
    assert validate_sft_row(sft_row()).metadata.weight == 1.0
    assert validate_pair_row(pair_row()).metadata.pair_source == "correct_incorrect"
    out = tmp_path / "sft.jsonl"
    assert write_rows(out, [sft_row(), sft_row()], "sft") == 2
    bad = sft_row(messages=[USER, {"role": "assistant", "content": "<plan>p</plan>"}])
    with pytest.raises(ValidationError):
        write_rows(out, [sft_row(), bad], "sft")
    assert len(read_rows(out, "sft")) == 2  # the old file is intact
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_read_rows_errors_name_the_line(tmp_path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(sft_row()) + "\n" + json.dumps(sft_row(messages=[USER])) + "\n")
    with pytest.raises(DistillError, match=r"x.jsonl:2: not a valid sft row"):
        read_rows(p, "sft")
    p.write_text("{not json\n")
    with pytest.raises(DistillError, match="not valid JSON"):
        read_rows(p, "sft")
    p.write_text("\n")
    with pytest.raises(DistillError, match="no sft rows"):
        read_rows(p, "sft")


def test_weights_become_repeat_counts() -> None:
    assert expand_weights([0.5, 1.0, 2.0]) == [1, 2, 4]
    assert expand_weights([1.0, 2.0, 1.0]) == [1, 2, 1]
    assert expand_weights([1.0, 100.0], max_repeat=8) == [1, 8]
    assert expand_weights([]) == []


@pytest.mark.parametrize(("busy", "free"), [
    ([2.0, 5.0], 2), ([3.0, 97.0], 1), ([60.0, 70.0], 0), ([100.0, 100.0], 0),
    ([30.0, 30.0, 30.0, 30.0], 3), ([], 0)])
def test_free_cores_counts_whole_idle_cores(busy, free) -> None:
    assert free_cores(busy) == free


def test_default_threads_leaves_busy_cores_alone() -> None:
    """With every usable core spinning, training gets one thread, not one per core."""
    cores = sorted(os.sched_getaffinity(0))
    spin = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin, str(c)]) for c in cores]
    try:
        # every spinner on its core (it has run), rather than a sleep that may be short
        assert wait_until(lambda: all(psutil.Process(p.pid).cpu_times().user > 0.05
                                      for p in spinners), seconds=30)
        assert default_threads(sample_seconds=0.5) == 1
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def test_default_threads_counts_only_the_cores_it_may_run_on(monkeypatch) -> None:
    import psutil

    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [1.0, 2.0, 99.0, 3.0])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert default_threads() == 2  # core 3 is idle but not ours; core 2 is busy


def test_train_refuses_bad_input_before_loading_a_model(tmp_path) -> None:
    with pytest.raises(DistillError, match="does not exist"):
        train(tmp_path / "missing.jsonl", out=tmp_path / "m")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DistillError, match="no sft rows"):
        train(empty, out=tmp_path / "m")
    good = tmp_path / "sft.jsonl"
    write_rows(good, [sft_row()], "sft")
    (tmp_path / "m").mkdir()
    with pytest.raises(DistillError, match="already exists"):
        train(good, out=tmp_path / "m")
    with pytest.raises(DistillError, match="pairs.jsonl does not exist"):
        train(good, out=tmp_path / "m2", pairs_path=tmp_path / "pairs.jsonl")
    assert not (tmp_path / "m2").exists()
