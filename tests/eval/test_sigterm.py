"""SIGTERM to `refinery eval run` closes its vLLM engine instead of orphaning it.

The rerun then finishes the run and exits cleanly: no traceback from a vLLM engine
freed at interpreter teardown (``AsyncLLM.__del__`` on emptied module globals).
Ctrl-C (SIGINT) first drains: the problems in flight finish and are recorded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.own_engines]
REFINERY = Path(sys.executable).parent / "refinery"


def _engine_children(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=True) if "VLLM" in " ".join(c.cmdline()) or
            c.name().startswith("VLLM")]


ENV = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
# The Ctrl-C run goes beside the SIGTERM test, each engine on a core of its own: an
# engine start is mostly one-core imports, so the module takes one start less.
CPUS = sorted(os.sched_getaffinity(0))
# Enough problems that the first answers come long before the last, few enough that
# the rerun finishes the rest quickly.
LIMIT = 32


def _env(slot: int) -> dict[str, str]:
    if len(CPUS) < 2:
        return ENV
    return {**ENV, "VLLM_CPU_OMP_THREADS_BIND": str(CPUS[slot])}


def _command(out: Path) -> list[str]:
    return [str(REFINERY), "eval", "run", "--dataset", "arith", "--limit", str(LIMIT),
            "--strategy", "cot", "--max-tokens", "64", "--out", str(out), "--no-progress"]


def _start_and_wait_for_answers(cmd: list[str], results: Path,
                                env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd``; return once its engine runs and the first problems are answered."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    wait_until(lambda: proc.poll() is not None or (results.exists() and
                                                    results.stat().st_size > 0),
               seconds=600, every=0.05)
    assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
    return proc


@dataclass
class Interrupted:
    """What a run interrupted at its first answers left: output, exit code, engine."""

    out: str = ""
    code: int | None = None
    engine: list[psutil.Process] = field(default_factory=list)


def _ctrl_c_at_first_answers(out: Path, done: Interrupted) -> None:
    try:
        proc = _start_and_wait_for_answers(_command(out) + ["--concurrency", "8"],
                                           out / "results.jsonl", _env(1))
    except AssertionError as exc:  # the run ended before answering: the test shows why
        done.out = str(exc)
        return
    try:
        done.engine = _engine_children(psutil.Process(proc.pid))
        proc.send_signal(signal.SIGINT)
        done.out = proc.communicate(timeout=300)[0].decode()
        done.code = proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module", autouse=True)
def ctrl_c_run(tmp_path_factory):
    """The Ctrl-C run, started with the module; its test waits for the thread."""
    out, done = tmp_path_factory.mktemp("ctrl-c") / "run", Interrupted()
    thread = threading.Thread(target=_ctrl_c_at_first_answers, args=(out, done), daemon=True)
    thread.start()
    yield out, done, thread
    thread.join(600)


def test_sigterm_closes_the_engine_and_the_rerun_finishes_cleanly(tmp_path, ctrl_c_run):
    cmd = _command(tmp_path / "run")
    results = tmp_path / "run" / "results.jsonl"
    proc = _start_and_wait_for_answers(cmd + ["--concurrency", "4"], results, _env(0))
    parent = psutil.Process(proc.pid)
    try:
        engine = _engine_children(parent)
        assert engine, "no vLLM engine process found under the eval run"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=180)[0].decode()
        assert proc.returncode == 130, out[-2000:]
        assert "rerun the same command to resume" in out
        assert "Exception ignored" not in out, out[-2000:]
        # The engine processes go with it (allow them a moment to be reaped).
        gone, alive = psutil.wait_procs(engine, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
        done = results.read_text().splitlines()
        assert 0 < len(done) < LIMIT

        # Concurrency is not part of a run's identity: the rerun resumes with more,
        # on both cores once the Ctrl-C run beside it has ended.
        ctrl_c_run[2].join(600)
        rerun = subprocess.run(cmd + ["--concurrency", "16"], capture_output=True, text=True,
                               env=ENV, timeout=900)
        out = rerun.stdout + rerun.stderr
        assert rerun.returncode == 0, out[-2000:]
        rest = LIMIT - len(done)
        assert f"{LIMIT}/{LIMIT} problems ({rest} run now, {len(done)} already done)" in out
        assert "Exception ignored" not in out and "Traceback" not in out, out[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_ctrl_c_drains_then_exits_130_with_every_started_problem_recorded(ctrl_c_run):
    out, done, thread = ctrl_c_run
    thread.join(600)
    assert not thread.is_alive(), "the Ctrl-C run hung"
    assert done.code is not None, done.out[-2000:]
    results, traces = out / "results.jsonl", out / "traces.jsonl"
    assert done.engine, "no vLLM engine process found under the eval run"
    assert done.code == 130, done.out[-2000:]
    assert "finishing the problems in flight" in done.out
    assert "interrupted after the problems in flight" in done.out
    assert "Traceback" not in done.out and "Exception ignored" not in done.out, done.out[-3000:]
    gone, alive = psutil.wait_procs(done.engine, timeout=60)
    assert not alive, [p.cmdline() for p in alive]
    # Every line whole, and each recorded problem has its one trace.
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    ids = [json.loads(line)["task_id"] for line in traces.read_text().splitlines()]
    assert 0 < len(rows) < LIMIT and sorted(r["id"] for r in rows) == sorted(ids)
    assert f"{len(rows)}/{LIMIT} problems ({len(rows)} run now, 0 already done)" in done.out
