"""Eval runs on a real local Ray cluster: two actors, each with its own small engine.

The reference is a local run of the same configuration on the session's engine:
a Ray run must produce the same problem ids, each exactly once, with the same
result and verdict fields. One actor is SIGKILLed mid-run: the run still ends
with every problem once (its in-flight tasks went to the other actor), no torn
line, its engine processes gone, and rerunning the command changes nothing.
One run shows both, so the module starts two actor engines, not four.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from refinery.eval.ray_pool import RayOptions
from refinery.eval.runner import RESULTS, TRACES, EvalConfig, run_eval
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.e2e

N = 16
# Two engines beside the session's: a small KV cache each (the model is 135M).
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
BIN = Path(sys.executable).parent


def config(out: Path, strategy: str, ray: RayOptions | None = None) -> EvalConfig:
    return EvalConfig(dataset="arith", strategy=strategy, limit=N, out=str(out),
                      max_tokens=64, concurrency=8, ray=ray)


def lines(path: Path) -> list[dict]:
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"{path} ends in a torn line"
    return [json.loads(line) for line in raw.splitlines()]


def assert_like_local(ray_dir: Path, local_dir: Path) -> None:
    """Same ids (each once), same row fields and golds, one trace per problem."""
    ray_rows, local_rows = lines(ray_dir / RESULTS), lines(local_dir / RESULTS)
    ids = [r["id"] for r in ray_rows]
    assert len(ids) == len(set(ids)) == N
    assert set(ids) == {r["id"] for r in local_rows}
    assert {tuple(sorted(r)) for r in ray_rows} == {tuple(sorted(local_rows[0]))}
    # a verdict's fields depend on its outcome (``method`` on a match, ``reason`` on
    # none); the fields both always have must agree problem by problem
    local_by_id = {r["id"]: r for r in local_rows}
    for r in ray_rows:
        mine, theirs = r["verdict"], local_by_id[r["id"]]["verdict"]
        assert mine["gold"] == theirs["gold"] == r["gold"], (mine, theirs)
        assert "extracted" in mine and r["prompt"] == local_by_id[r["id"]]["prompt"]
    assert {r["strategy"] for r in ray_rows} == {local_rows[0]["strategy"]}
    assert all(r["usage"]["calls"] >= 1 and r["error"] is None for r in ray_rows), ray_rows
    assert sorted(t["task_id"] for t in lines(ray_dir / TRACES)) == sorted(ids)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def actors_of(run: psutil.Process) -> list[psutil.Process]:
    """The Ray actors among ``run``'s descendants (titled ``ray::TaskActor...``)."""
    actors = []
    for p in run.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if (p.cmdline() or [""])[0].startswith("ray::TaskActor"):
                actors.append(p)
    return actors


@dataclass
class KilledRun:
    """A run one of whose actors was SIGKILLed: its exit code and output, the
    processes of its Ray when the kill came (pid: name), the killed actor's engine."""

    code: int
    printed: str
    logged: str
    ray: dict[int, str]
    engine: list[int]


def run_killing_an_actor(cmd: list[str], results: Path, logs: Path) -> KilledRun:
    """Run ``cmd``; SIGKILL one of its two actors once the first result is written.

    With 2 tasks in flight per actor the queue keeps both busy until the end, so
    the kill surely hits in-flight work (at the first result 12 are still to go).
    """
    with open(logs / "stdout", "wb") as stdout, open(logs / "stderr", "wb") as stderr:
        run = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env={**os.environ, **ENV})
    try:
        wait_until(lambda: run.poll() is not None or (results.exists() and
                                                       results.stat().st_size > 0),
                   seconds=600, every=0.005)
        assert run.poll() is None, (logs / "stderr").read_text()[-3000:]
        parent, ray = psutil.Process(run.pid), {}
        for p in parent.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                ray[p.pid] = p.name()
        [victim, _] = actors_of(parent)
        engine = [c.pid for c in victim.children(recursive=True)]
        victim.send_signal(signal.SIGKILL)
        code = run.wait(600)
    finally:
        run.kill()
    return KilledRun(code, (logs / "stdout").read_text(), (logs / "stderr").read_text(), ray,
                     engine)


async def test_two_actors_answer_like_a_local_run_and_a_killed_one_loses_nothing(
        tmp_path, vllm_backend):
    """``refinery eval run --ray`` on a Ray it starts itself, two actors, one of them
    SIGKILLed mid-run; the same run on the session's engine is the reference."""
    spec, out = "sc(cot, n=2)", tmp_path / "ray"
    await run_eval(config(tmp_path / "local", spec), backend=vllm_backend, progress=False)
    cmd = [str(BIN / "refinery"), "eval", "run", "--dataset", "arith", "--strategy", spec,
           "--limit", str(N), "--out", str(out), "--max-tokens", "64",
           "--concurrency", "2", "--ray", "--ray-replicas", "2", "--no-progress"]
    run = await asyncio.to_thread(run_killing_an_actor, cmd, out / RESULTS, tmp_path)
    assert run.code == 0, run.logged[-3000:]
    assert run.engine, "the actor ran its engine in child processes"
    assert "its tasks go to the others" in run.logged, run.logged[-3000:]
    assert f"{N}/{N} problems ({N} run now, 0 already done)" in run.printed
    assert_like_local(out, tmp_path / "local")
    recorded = json.loads((out / "config.json").read_text())["ray"]
    assert recorded["replicas"] == 2 and recorded["address"] is None
    assert await wait_for(lambda: not any(map(running, run.engine)), seconds=30), \
        "orphaned engine"
    # the Ray the command started for itself is gone with it
    assert {"raylet", "gcs_server"} <= set(run.ray.values()), run.ray
    assert await wait_for(lambda: not any(map(running, run.ray)), seconds=60), \
        {pid: name for pid, name in run.ray.items() if running(pid)}

    before = [(out / f).read_bytes() for f in (RESULTS, TRACES)]
    again = await run_eval(config(out, spec, RayOptions(replicas=2)), progress=False)
    assert (again.ran, again.skipped, again.done) == (0, N, N)
    assert [(out / f).read_bytes() for f in (RESULTS, TRACES)] == before
