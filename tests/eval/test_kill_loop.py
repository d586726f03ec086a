"""``refinery eval run`` SIGKILLed again and again against a real model, and on a full disk.

The CLI runs as a subprocess over vLLM's own OpenAI server (the real model);
each time it is killed at a random (seeded) point: either a random delay after
start (startup, compaction, first requests) or just after a random number of
new result lines (mid-run, possibly mid-write). The same command is rerun each
time, then once more to the end. After every kill: each newline-terminated line
of results.jsonl and traces.jsonl parses, ids are unique, every result present
after the previous kill is still there unchanged, every result has its trace.
At the end the result ids are exactly the dataset's.

A full disk (the file a symlink to ``/dev/full``, where writes fail with
ENOSPC) stops the run with exit 2 and a message naming the file; after space
is back the same command finishes with every problem exactly once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refinery.engine.errors import BackendUnavailableError, StorageError
from refinery.engine.trace import Trace
from refinery.eval.datasets import load_arith
from refinery.eval.runner import CONFIG, RESULTS, TRACES, RunAborted, read_results, run_eval
from tests.conftest import repeat
from tests.eval._resume_worker import SlowBackend, backend, config
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
REFINERY = Path(sys.executable).parent / "refinery"
N = 40
# ``make test``'s 5 seeded kills: 2 just after new results, 2 at 3-4 s after the
# start and 1 at 0.2 s, each kind of kill point at least once.
KILLS = repeat(5, 22)
SEED = 1234


def command(out: Path, url: str, n: int = N) -> list[str]:
    exe = [str(REFINERY)] if REFINERY.exists() else [sys.executable, "-m", "refinery.cli"]
    return exe + ["eval", "run", "--dataset", "arith", "--strategy", "cot", "--limit", str(n),
                  "--out", str(out), "--max-tokens", "48", "--concurrency", "8",
                  "--temperature", "0", "--backend", "openai", "--base-url", url,
                  "--no-progress"]


def start(cmd: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OPENAI_API_KEY": "EMPTY"}
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)


def whole_lines(path: Path) -> tuple[list[bytes], bool]:
    """The newline-terminated lines of a file, and whether an unterminated tail follows."""
    raw = path.read_bytes() if path.exists() else b""
    *whole, tail = raw.split(b"\n")
    return whole, bool(tail)


def check_run_dir(out: Path) -> tuple[dict[str, dict], bool, bool]:
    """Parse every whole line (raises on a torn one); results by id, and the torn tails."""
    res_lines, res_torn = whole_lines(out / RESULTS)
    rows = [json.loads(line) for line in res_lines]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a result was recorded twice"
    tr_lines, tr_torn = whole_lines(out / TRACES)
    trace_ids = [Trace.model_validate_json(line).task_id for line in tr_lines]
    assert len(trace_ids) == len(set(trace_ids)), "a trace was kept twice"
    assert set(ids) <= set(trace_ids), "a result without its trace"
    return {r["id"]: r for r in rows}, res_torn, tr_torn


def wait_for_lines(proc: subprocess.Popen, path: Path, target: int) -> None:
    """Until results.jsonl holds ``target`` newlines or the run ends (no timed assert:
    the deadline only turns a hang into a failure)."""
    wait_until(lambda: proc.poll() is not None or (path.exists() and
                                                    path.read_bytes().count(b"\n") >= target),
               seconds=300, every=0.005)


@pytest.mark.e2e
def test_sigkill_loop_loses_and_duplicates_nothing(vllm_server, tmp_path) -> None:
    out = tmp_path / "run"
    rng = random.Random(SEED)
    cmd = command(out, vllm_server)
    prev: dict[str, dict] = {}
    kills = finished_early = grew = torn_results = torn_traces = lines_checked = 0
    while kills < KILLS:
        proc = start(cmd)
        try:
            if rng.random() < 0.4:  # anywhere in startup, compaction, first requests
                time.sleep(rng.uniform(0.1, 4.0))
            else:  # just after 1-3 new results: mid-run, maybe mid-write
                have = (out / RESULTS).read_bytes().count(b"\n") if (out / RESULTS).exists() else 0
                wait_for_lines(proc, out / RESULTS, have + rng.randint(1, 3))
                time.sleep(rng.uniform(0.0, 0.05))
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                kills += 1
            else:
                finished_early += 1
                assert proc.returncode == 0, proc.stderr.read().decode()[-2000:]
        finally:
            proc.kill()
            _, err = proc.communicate()
        rows, r_torn, t_torn = check_run_dir(out)
        torn_results += r_torn
        torn_traces += t_torn
        lines_checked += len(rows)
        for rid, row in prev.items():
            assert rows.get(rid) == row, f"result {rid} lost or changed after kill {kills}"
        grew += len(rows) > len(prev)
        prev = rows

    final = start(cmd)
    stdout, stderr = final.communicate(timeout=600)
    assert final.returncode == 0, stderr.decode()[-3000:]
    rows, r_torn, t_torn = check_run_dir(out)
    assert not r_torn and not t_torn
    for rid, row in prev.items():
        assert rows[rid] == row
    want = {e.id for e in load_arith(limit=N)}
    assert set(rows) == want and len(rows) == N
    assert sorted(r["id"] for r in read_results(out / RESULTS)) == sorted(want)
    trace_ids = [Trace.model_validate_json(x).task_id for x in whole_lines(out / TRACES)[0]]
    assert sorted(trace_ids) == sorted(want)
    assert all(r["finish_reason"] in ("stop", "length") and r["usage"]["calls"] == 1
               for r in rows.values())  # real generations, not errors
    sessions = {r["session"] for r in rows.values()}
    print(f"\nkills={kills} runs that finished before their kill={finished_early} "
          f"kill cycles that added results={grew} sessions={len(sessions)} "
          f"torn tails after a kill: results={torn_results} traces={torn_traces} "
          f"result lines checked={lines_checked} final: {len(rows)}/{N} unique, lost=0")
    assert kills == KILLS and len(sessions) >= 2


@pytest.mark.e2e
def test_full_disk_stops_the_cli_with_a_clear_error_and_loses_nothing(vllm_server,
                                                                      tmp_path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    cmd = command(out, vllm_server, n=6)
    (out / TRACES).symlink_to("/dev/full")
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]  # a failure at run time, not a usage error
    assert f"could not write a trace to {out / TRACES}: No space left on device" in p.stderr
    assert "Traceback" not in p.stderr
    assert (out / CONFIG).exists() and read_results(out / RESULTS) == []

    (out / TRACES).unlink()
    (out / RESULTS).symlink_to("/dev/full")
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr[-2000:]  # a failure at run time, not a usage error
    assert f"could not write a result to {out / RESULTS}: No space left on device" in p.stderr

    (out / RESULTS).unlink()  # space is back: the same command finishes the run
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    ids = [r["id"] for r in read_results(out / RESULTS)]
    assert sorted(ids) == sorted(e.id for e in load_arith(limit=6))
    traces = [Trace.model_validate_json(x).task_id for x in whole_lines(out / TRACES)[0]]
    assert sorted(traces) == sorted(ids)


async def test_full_disk_in_process_raises_storage_error_then_resumes(tmp_path) -> None:
    out = tmp_path / "run"

    def dead(messages, params, i):
        raise BackendUnavailableError("engine down")

    # A first run that records its config but no result (the backend is down).
    with pytest.raises(RunAborted):
        await run_eval(config(str(out), 5), backend=SlowBackend([(r".*", dead)]),
                       progress=False)
    (out / RESULTS).symlink_to("/dev/full")
    with pytest.raises(StorageError, match=r"could not write a result to .*results\.jsonl: "
                                           r"No space left on device"):
        await run_eval(config(str(out), 5), backend=backend(0), progress=False)
    (out / RESULTS).unlink()
    s = await run_eval(config(str(out), 5), backend=backend(0), progress=False)
    assert (s.done, s.ran) == (5, 5)
    ids = [r["id"] for r in read_results(out / RESULTS)]
    assert sorted(ids) == sorted(e.id for e in load_arith(limit=5))
