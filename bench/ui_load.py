"""Web page load: the largest trace the explorer draws, and what drawing it costs others.

Writes a run directory whose trace has ``MAX_EVENTS`` events (chains of 50 calls,
each with ``--samples`` outputs of ``--text`` characters), serves it with
``refinery ui`` as a subprocess on 127.0.0.1, and measures:

- the render time of that trace's page (median of ``--renders`` loads, after one
  that builds the traces index);
- a static file's latency alone, and while the trace is being drawn (requests
  one after another from a second client): median and worst, and the worst
  delay as a fraction of the render time (1.0 would mean the static request
  waited for the whole drawing, as on a blocked event loop).

    python bench/ui_load.py [--samples 4] [--text 200] [--renders 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from refinery.ui.traceview import MAX_EVENTS

BIN = Path(sys.executable).parent
STATIC = "/ui/static/ui.css"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_run(root: Path, samples: int, text: int) -> str:
    """A run ``big`` whose one trace has ``MAX_EVENTS`` events; its trace page's path."""
    run = root / "big"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({
        "model": "bench", "dataset": {"name": "bench", "n_problems": 1},
        "strategy": {"spec": "sc(cot, n=4)", "canonical": "sc(cot, n=4)"}}))
    (run / "results.jsonl").write_text(json.dumps({
        "id": "big", "index": 0, "passed": True, "usage": {"total_tokens": 1}}) + "\n")
    output = {"text": "o" * text, "finish_reason": "stop", "prompt_tokens": 30,
              "completion_tokens": 50}
    events = [{"id": f"e{i}", "kind": "generation", "step": "draft", "strategy": "cot",
               "parents": [f"e{i - 1}"] if i % 50 else [], "text": "t" * text,
               "completions": [output] * samples} for i in range(MAX_EVENTS)]
    trace = {"task_id": "big", "strategy": "sc(cot, n=4)", "events": events}
    (run / "traces.jsonl").write_text(json.dumps(trace, separators=(",", ":")) + "\n")
    return "/ui/trace?run=big&task=big"


def start(runs: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(BIN / "refinery"), "ui", "--runs", str(runs), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(url + STATIC, timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("refinery ui did not start")


def timed_get(client: httpx.Client, path: str) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    r = client.get(path)
    r.raise_for_status()
    return time.perf_counter() - started, r


def static_alone(url: str, n: int = 50) -> list[float]:
    with httpx.Client(base_url=url, timeout=60) as h:
        return [timed_get(h, STATIC)[0] for _ in range(n)]


def static_during(url: str, page: str) -> tuple[float, list[float]]:
    """The render time of ``page`` and the static latencies measured meanwhile."""
    done, waits = threading.Event(), []

    def probe() -> None:
        with httpx.Client(base_url=url, timeout=60) as h:
            while not done.is_set():
                waits.append(timed_get(h, STATIC)[0])
                time.sleep(0.01)

    prober = threading.Thread(target=probe)
    with httpx.Client(base_url=url, timeout=300) as h:
        prober.start()
        try:
            seconds, _ = timed_get(h, page)
        finally:
            done.set()
            prober.join()
    return seconds, waits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=4, help="outputs per call")
    ap.add_argument("--text", type=int, default=200, help="characters per text")
    ap.add_argument("--renders", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        page = write_run(Path(tmp), args.samples, args.text)
        size = (Path(tmp) / "big" / "traces.jsonl").stat().st_size
        proc, url = start(Path(tmp))
        try:
            with httpx.Client(base_url=url, timeout=300) as h:
                first, r = timed_get(h, page)
                renders = [timed_get(h, page)[0] for _ in range(args.renders)]
            html = len(r.content)
            alone = static_alone(url)
            during = [static_during(url, page) for _ in range(args.renders)]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    render = statistics.median(renders)
    waits = [w for _, ws in during for w in ws]
    worst = max(waits)
    print(f"trace: {MAX_EVENTS:,} events, {size / 1e6:.1f} MB of JSON; page {html / 1e6:.1f} MB")
    print(f"render: first load {first:.2f} s (builds the traces index), then median "
          f"{render:.2f} s of {args.renders}")
    print(f"static {STATIC} alone: median {1000 * statistics.median(alone):.1f} ms, "
          f"max {1000 * max(alone):.1f} ms")
    print(f"static while the trace is drawn: {len(waits)} requests, median "
          f"{1000 * statistics.median(waits):.1f} ms, max {1000 * worst:.1f} ms")
    renders_during = statistics.median(s for s, _ in during)
    print(f"worst static delay / render time: {worst / renders_during:.2f} "
          f"(1.00: it waited for the whole drawing)")


if __name__ == "__main__":
    main()
