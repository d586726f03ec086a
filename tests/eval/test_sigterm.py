"""SIGTERM to `refinery eval run` closes its vLLM engine instead of orphaning it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e
REFINERY = Path(sys.executable).parent / "refinery"


def _engine_children(proc: psutil.Process) -> list[psutil.Process]:
    return [c for c in proc.children(recursive=True) if "VLLM" in " ".join(c.cmdline()) or
            c.name().startswith("VLLM")]


def test_sigterm_closes_the_engine(tmp_path):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen(
        [str(REFINERY), "eval", "run", "--dataset", "arith", "--limit", "64", "--strategy",
         "cot", "--max-tokens", "64", "--concurrency", "4", "--out", str(tmp_path / "run"),
         "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    parent = psutil.Process(proc.pid)
    try:
        # Wait until the engine runs and the first problems are answered.
        results = tmp_path / "run" / "results.jsonl"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if results.exists() and results.stat().st_size > 0:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        engine = _engine_children(parent)
        assert engine, "no vLLM engine process found under the eval run"
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=180)[0].decode()
        assert proc.returncode == 130, out[-2000:]
        assert "rerun the same command to resume" in out
        # The engine processes go with it (allow them a moment to be reaped).
        gone, alive = psutil.wait_procs(engine, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
        done = results.read_text().splitlines()
        assert 0 < len(done) < 64
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
