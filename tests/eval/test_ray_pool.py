"""Eval runs on a real local Ray cluster: two actors, each with its own small engine.

The reference is a local run of the same configuration on the session's engine:
a Ray run must produce the same problem ids, each exactly once, with the same
result and verdict fields. One actor is SIGKILLed mid-run: the run still ends
with every problem once (its in-flight tasks went to the other actor), no torn
line, its engine processes gone, and rerunning the command changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from refinery.eval.ray_pool import RayOptions
from refinery.eval.runner import RESULTS, TRACES, EvalConfig, run_eval
from tests.conftest import free_port
from tests.waiting import wait_for

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


def ray_processes() -> list[psutil.Process]:
    names = ("raylet", "gcs_server", "ray::")
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if any(n in cmd for n in names) and p.pid != os.getpid():
            out.append(p)
    return out


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def actor_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith("ray::TaskActor")]


async def test_cli_runs_cot_on_two_actors_like_a_local_run(tmp_path, vllm_backend):
    await run_eval(config(tmp_path / "local", "cot"), backend=vllm_backend, progress=False)
    cmd = [str(BIN / "refinery"), "eval", "run", "--dataset", "arith", "--strategy", "cot",
           "--limit", str(N), "--out", str(tmp_path / "ray"), "--max-tokens", "64",
           "--concurrency", "8", "--ray", "--ray-replicas", "2", "--no-progress"]
    done = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True,
                                   env={**os.environ, **ENV}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{N}/{N} problems ({N} run now, 0 already done)" in done.stdout
    assert_like_local(tmp_path / "ray", tmp_path / "local")
    recorded = json.loads((tmp_path / "ray" / "config.json").read_text())["ray"]
    assert recorded["replicas"] == 2 and recorded["address"] is None
    # the Ray the command started for itself is gone with it
    assert not [p.info["cmdline"][:2] for p in ray_processes()]


@pytest.fixture(scope="module")
def ray_head():
    """``ray start --head`` on loopback with this machine's 2 CPUs; stopped after."""
    port = free_port()
    env = {**os.environ, **ENV, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
                    "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false"],
                   check=True, capture_output=True, env=env, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, timeout=120)



async def test_a_killed_actor_loses_and_duplicates_nothing(tmp_path, ray_head, vllm_backend,
                                                           caplog):
    spec = "sc(cot, n=2)"
    await run_eval(config(tmp_path / "local", spec), backend=vllm_backend, progress=False)
    # 2 in flight per actor: the queue keeps both busy until the end, so the kill at the
    # first result surely hits in-flight work (8 at once finish in one batch, together)
    cfg = config(tmp_path / "ray", spec, RayOptions(address=ray_head, replicas=2)).model_copy(
        update={"concurrency": 2})
    victim: dict[str, list[int]] = {}

    def kill_one(row: dict) -> None:  # at the first result, 12 problems are still to go
        if not victim:
            proc = actor_processes()[0]
            victim["engine"] = [c.pid for c in proc.children(recursive=True)]
            os.kill(proc.pid, signal.SIGKILL)

    with caplog.at_level(logging.WARNING, logger="refinery.eval.ray_pool"):
        summary = await run_eval(cfg, progress=False, on_result=kill_one)
    assert victim["engine"], "the actor ran its engine in child processes"
    assert summary.done == summary.ran == N
    handed_back = [r for r in caplog.records if "go to the others" in r.getMessage()]
    assert handed_back, [r.getMessage() for r in caplog.records]
    assert_like_local(tmp_path / "ray", tmp_path / "local")
    gone = await wait_for(lambda: not any(running(p) for p in victim["engine"]), seconds=30)
    assert gone, "orphaned engine"

    before = [(tmp_path / "ray" / f).read_bytes() for f in (RESULTS, TRACES)]
    again = await run_eval(cfg, progress=False)
    assert (again.ran, again.skipped, again.done) == (0, N, N)
    assert [(tmp_path / "ray" / f).read_bytes() for f in (RESULTS, TRACES)] == before
