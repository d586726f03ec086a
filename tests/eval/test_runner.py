"""The runner: result lines, config, traces, resume (also after SIGKILL), refusal of a
different run, backend death, strategy crashes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from refinery.engine.errors import BackendUnavailableError, SpecError
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.trace import read_traces
from refinery.eval.datasets import load_arith
from refinery.eval.runner import (
    CONFIG,
    RESULTS,
    TRACES,
    ConfigMismatchError,
    RunAborted,
    read_results,
    run_eval,
)
from tests.eval._resume_worker import SlowBackend, backend, config

ROOT = Path(__file__).resolve().parents[2]
ROW_KEYS = {"id", "index", "dataset", "level", "prompt", "gold", "prediction", "text", "passed",
            "score", "strict_match", "flexible_match", "usage", "seconds", "finish_reason",
            "error", "verdict", "strategy", "model", "session", "session_start", "time"}


def solver(levels_right: set[int], n: int) -> SlowBackend:
    """Answers arith problems of the given levels correctly, the others wrongly."""
    gold = {e.prompt: (e.gold, e.level) for e in load_arith(limit=n)}

    def reply(messages, params, i) -> str:
        question = messages[-1].content.split("\n\n")[0]
        g, level = gold[question]
        return f"Step by step... \\boxed{{{g if level in levels_right else int(g) + 1}}}"

    return SlowBackend([(r".*", reply)])


def trace_ids(out: Path) -> list[str]:
    return [json.loads(line)["task_id"] for line in (out / TRACES).read_text().splitlines()]


async def test_run_writes_result_lines_config_and_traces(tmp_path) -> None:
    out = tmp_path / "run"
    be = solver({1, 2}, 10)
    summary = await run_eval(config(str(out), 10), backend=be, progress=False)
    assert (summary.total, summary.done, summary.ran, summary.skipped) == (10, 10, 10, 0)
    assert summary.accuracy.correct == 4  # levels 1 and 2 of 10 interleaved problems
    rows = read_results(out / RESULTS)
    assert len(rows) == 10 and {r["id"] for r in rows} == {e.id for e in load_arith(limit=10)}
    for r in rows:
        assert set(r) == ROW_KEYS
        assert r["passed"] == (r["level"] <= 2) and r["score"] == float(r["passed"])
        assert r["strategy"] == "cot" and r["model"] == "scripted" and r["error"] is None
        assert r["usage"]["calls"] == 1 and r["finish_reason"] == "stop"
        assert r["usage"]["completion_tokens"] == 4  # words of the scripted reply
        assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 4
        assert r["prediction"] == r["text"].split("{")[1].rstrip("}")
        assert r["strict_match"] is None  # GSM8K only
    cfg = json.loads((out / CONFIG).read_text())
    assert cfg["strategy"]["canonical"] == "cot" and cfg["strategy"]["graph"]["nodes"][0][
        "name"] == "cot"
    assert cfg["identity"]["n_problems"] == 10 and cfg["dataset"]["has_levels"] is True
    assert cfg["sampling"]["temperature"] == 0.0 and cfg["model"] == "scripted"
    assert set(cfg["code"]) >= {"git_commit", "package_version"}
    assert sorted(trace_ids(out)) == sorted(r["id"] for r in rows)
    # each trace keeps its task as asked, with the gold, for distillation
    tasks = {t.task_id: t.task for t in read_traces(out / TRACES)}
    assert {i: (t.id, t.question, t.gold) for i, t in tasks.items()} == {
        r["id"]: (r["id"], r["prompt"], r["gold"]) for r in rows}


async def test_rerun_skips_finished_problems_and_repairs_a_torn_line(tmp_path) -> None:
    out = tmp_path / "run"
    await run_eval(config(str(out), 10), backend=backend(0), progress=False)
    again = backend(0)
    s = await run_eval(config(str(out), 10), backend=again, progress=False)
    assert (s.ran, s.skipped, s.done) == (0, 10, 10) and again.calls == []
    # crash simulation: keep 6 lines, a torn 7th, and an orphan trace of an unfinished problem
    lines = (out / RESULTS).read_bytes().splitlines(keepends=True)
    (out / RESULTS).write_bytes(b"".join(lines[:6]) + lines[6][:40])
    first = {json.loads(x)["id"] for x in lines[:6]}
    s = await run_eval(config(str(out), 10), backend=backend(0), progress=False)
    assert (s.ran, s.skipped, s.done) == (4, 6, 10)
    data = (out / RESULTS).read_bytes()
    assert data.endswith(b"\n")
    ids = [r["id"] for r in read_results(out / RESULTS)]
    assert len(ids) == 10 and len(set(ids)) == 10 and first <= set(ids)
    # the traces of the 4 re-run problems were written twice in all; one each is kept
    assert sorted(trace_ids(out)) == sorted(ids)


async def test_same_run_spelled_differently_resumes(tmp_path) -> None:
    out = tmp_path / "run"
    await run_eval(config(str(out), 5), backend=backend(0), progress=False)
    cfg = config(str(out), 5).model_copy(update={"strategy": "cot()", "concurrency": 1})
    s = await run_eval(cfg, backend=backend(0), progress=False)
    assert s.skipped == 5 and s.ran == 0


async def test_a_different_run_is_refused_unless_forced(tmp_path) -> None:
    out = tmp_path / "run"
    await run_eval(config(str(out), 5), backend=backend(0), progress=False)
    other = config(str(out), 5).model_copy(update={"strategy": "sc(cot, n=2)"})
    mismatch = r"strategy: recorded 'cot', now 'sc\(cot, n=2\)'"
    with pytest.raises(ConfigMismatchError, match=mismatch):
        await run_eval(other, backend=backend(0), progress=False)
    with pytest.raises(ConfigMismatchError, match="limit"):
        await run_eval(config(str(out), 6), backend=backend(0), progress=False)
    s = await run_eval(other, backend=backend(0), progress=False, force=True)
    assert s.ran == 5 and s.skipped == 0
    aside = list(out.glob("replaced-*"))
    assert len(aside) == 1 and len(read_results(aside[0] / RESULTS)) == 5
    assert json.loads((out / CONFIG).read_text())["strategy"]["canonical"] == "sc(cot, n=2)"
    with pytest.raises(SpecError):
        await run_eval(config(str(out), 5).model_copy(update={"strategy": "cott"}),
                       backend=backend(0), progress=False)


async def test_shards_made_with_skip_are_the_whole_run_in_pieces(tmp_path) -> None:
    whole = [e.id for e in load_arith(limit=10)]
    a = await run_eval(config(str(tmp_path / "a"), 4), backend=solver({1, 2}, 10),
                       progress=False)
    b_cfg = config(str(tmp_path / "b"), 6).model_copy(update={"skip": 4})
    b = await run_eval(b_cfg, backend=solver({1, 2}, 10), progress=False)
    ids = [r["id"] for r in read_results(tmp_path / "a" / RESULTS)]
    later = [r["id"] for r in read_results(tmp_path / "b" / RESULTS)]
    assert sorted(ids) == sorted(whole[:4]) and sorted(later) == sorted(whole[4:])
    # levels 1 and 2 of 1-5 interleaved: problems 1, 2 in the first shard; 6, 7 in the second
    assert (a.accuracy.correct, b.accuracy.correct, b.total) == (2, 2, 6)
    recorded = json.loads((tmp_path / "b" / CONFIG).read_text())
    assert recorded["identity"]["skip"] == 4 and recorded["dataset"]["skip"] == 4
    # a run without a skip records none, so directories made before it still resume
    assert "skip" not in json.loads((tmp_path / "a" / CONFIG).read_text())["identity"]
    with pytest.raises(ConfigMismatchError, match="skip"):
        await run_eval(b_cfg.model_copy(update={"skip": 3}), backend=backend(0),
                       progress=False)


class MonitorRecorder(SlowBackend):
    """Records the loop monitor each call was given."""

    def __init__(self) -> None:
        super().__init__([(r".*", "The answer is \\boxed{3}.")])
        self.monitors: list = []

    async def generate(self, messages, params, *, n=None, stop_rule=None):
        self.monitors.append(stop_rule)
        return await super().generate(messages, params, n=n, stop_rule=stop_rule)


async def test_loop_policy_reaches_the_backend_and_is_part_of_the_run(tmp_path) -> None:
    on, off = MonitorRecorder(), MonitorRecorder()
    await run_eval(config(str(tmp_path / "on"), 3), backend=on, progress=False)
    no_loops = config(str(tmp_path / "off"), 3).model_copy(update={"loop_policy": "off"})
    await run_eval(no_loops, backend=off, progress=False)
    assert len(on.monitors) == 3 and all(isinstance(m, CusumLoopDetector) for m in on.monitors)
    assert off.monitors == [None, None, None]
    recorded = json.loads((tmp_path / "on" / CONFIG).read_text())["identity"]
    assert recorded["loop_policy"] == "retry"  # the server's default for strategies
    other = no_loops.model_copy(update={"out": str(tmp_path / "on")})
    with pytest.raises(ConfigMismatchError, match="loop_policy: recorded 'retry', now 'off'"):
        await run_eval(other, backend=MonitorRecorder(), progress=False)


async def test_backend_death_aborts_without_recording_and_resume_finishes(tmp_path) -> None:
    out = tmp_path / "run"
    victim = load_arith(limit=8)[5]

    def reply(messages, params, i):
        if victim.prompt in messages[-1].content:
            raise BackendUnavailableError("vLLM engine is dead")
        return "\\boxed{1}"

    with pytest.raises(RunAborted, match="rerun the same command"):
        await run_eval(config(str(out), 8), backend=SlowBackend([(r".*", reply)]),
                       progress=False)
    assert victim.id not in {r["id"] for r in read_results(out / RESULTS)}
    s = await run_eval(config(str(out), 8), backend=backend(0), progress=False)
    ids = [r["id"] for r in read_results(out / RESULTS)]
    assert s.done == 8 and sorted(ids) == sorted(e.id for e in load_arith(limit=8))


class EngineLost(BackendUnavailableError):
    """A kind of engine failure the runner has never heard of by name."""


async def test_infrastructure_failure_is_decided_by_exception_type(tmp_path) -> None:
    def lost(messages, params, i):
        raise EngineLost("the accelerator went away")

    with pytest.raises(RunAborted, match="EngineLost: the accelerator went away"):
        await run_eval(config(str(tmp_path / "a"), 3), backend=SlowBackend([(r".*", lost)]),
                       progress=False)

    def refused(messages, params, i):  # an ordinary error that only mentions the engine
        raise SpecError("BackendUnavailableError: looks like one, is not")

    s = await run_eval(config(str(tmp_path / "b"), 3), backend=SlowBackend([(r".*", refused)]),
                       progress=False)
    rows = read_results(tmp_path / "b" / RESULTS)
    assert s.done == 3 and all(r["error"].startswith("SpecError: ") for r in rows)


async def test_strategy_crash_is_recorded_and_retry_errors_reruns_it(tmp_path) -> None:
    out = tmp_path / "run"
    victim = load_arith(limit=6)[2]

    def reply(messages, params, i):
        if victim.prompt in messages[-1].content:
            raise ValueError("strategy bug")
        return "\\boxed{1}"

    s = await run_eval(config(str(out), 6), backend=SlowBackend([(r".*", reply)]),
                       progress=False)
    assert s.done == 6 and s.cost.errors == 1
    [bad] = [r for r in read_results(out / RESULTS) if r["error"]]
    assert bad["id"] == victim.id and bad["passed"] is False
    assert bad["error"].startswith("StrategyCrash: ValueError: strategy bug")
    s = await run_eval(config(str(out), 6), backend=backend(0), progress=False,
                       retry_errors=True)
    rows = read_results(out / RESULTS)
    assert (s.ran, s.done) == (1, 6) and len(rows) == 6
    assert not any(r["error"] for r in rows)


def first_call_does(action: Callable[[], None]) -> SlowBackend:
    """Answers ``\\boxed{1}``; runs ``action`` at its first call, when the first 4
    problems (the configured concurrency) are in flight."""

    calls = []

    def reply(messages, params, i):
        calls.append(i)
        if len(calls) == 1:
            action()
        return "\\boxed{1}"

    return SlowBackend([(r".*", reply)], delay=0.01)


async def test_a_drain_records_the_problems_in_flight_and_a_rerun_finishes(tmp_path) -> None:
    out, stop = tmp_path / "run", asyncio.Event()
    s = await run_eval(config(str(out), 10), backend=first_call_does(stop.set), progress=False,
                       stop=stop)
    assert (s.total, s.done, s.ran) == (10, 4, 4)
    rows = read_results(out / RESULTS)
    first4 = [e.id for e in load_arith(limit=10)[:4]]
    assert sorted(r["id"] for r in rows) == sorted(first4) == sorted(trace_ids(out))
    assert not any(r["error"] for r in rows)
    again = await run_eval(config(str(out), 10), backend=backend(0), progress=False)
    assert (again.ran, again.skipped, again.done) == (6, 4, 10)
    assert sorted(trace_ids(out)) == sorted(e.id for e in load_arith(limit=10))


def _worker(out: Path, n: int, delay: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.eval._resume_worker", str(out),
                             str(n), str(delay)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sigkill_part_way_then_rerun_gives_each_problem_exactly_once(tmp_path) -> None:
    n = 40
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    proc = _worker(killed, n, 0.1)  # 4 in flight, 0.1 s per call: about 1 s of work
    deadline = time.monotonic() + 60
    try:
        while True:
            p = killed / RESULTS
            if p.exists() and p.read_bytes().count(b"\n") >= 8:
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "worker made no progress"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    before = read_results(killed / RESULTS)
    assert 8 <= len(before) < n, "the kill did not land part-way"
    # a crash mid-write could leave a torn line; make sure one is handled
    with open(killed / RESULTS, "ab") as f:
        f.write(b'{"id": "arith-test-s0-L1-99", "ind')

    rerun = _worker(killed, n, 0.0)
    out, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["skipped"] == len(before) and summary["done"] == n
    assert summary["ran"] == n - len(before)

    full = _worker(clean, n, 0.0)
    out, err = full.communicate(timeout=60)
    assert full.returncode == 0, err[-3000:]

    got = [r["id"] for r in read_results(killed / RESULTS)]
    want = [r["id"] for r in read_results(clean / RESULTS)]
    assert len(got) == n and len(set(got)) == n
    assert sorted(got) == sorted(want) == sorted(e.id for e in load_arith(limit=n))
    assert {r["id"] for r in before} <= set(got)
    assert (killed / RESULTS).read_bytes().endswith(b"\n")
    # same answers as the uninterrupted run, problem by problem
    by_id = {r["id"]: r["passed"] for r in read_results(clean / RESULTS)}
    assert {r["id"]: r["passed"] for r in read_results(killed / RESULTS)} == by_id
    assert sorted(trace_ids(killed)) == sorted(got)
    sessions = {r["session"] for r in read_results(killed / RESULTS)}
    assert len(sessions) == 2
