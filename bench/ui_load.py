"""Web page load: the largest trace the explorer draws, and what drawing it costs others.

Writes a run directory whose trace has ``MAX_EVENTS`` events (chains of 50 calls,
each with ``--samples`` outputs of ``--text`` characters) and serves it with the
page's app (``refinery ui``'s) in two subprocesses on 127.0.0.1, side by side:

- ``process``: trace pages drawn in the worker process (the default);
- ``thread``: drawn in the server's own threads (``draw_in_process=False``).

For each, in mirrored rounds (process, thread, thread, process, ...):

- the render time of that trace's page (after one load that starts the worker
  and builds the traces index);
- a static file's latency alone, and while the trace is being drawn (requests
  one after another from a second client): median and worst, and the worst
  delay as a fraction of the render time (1.0 would mean the static request
  waited for the whole drawing, as on a blocked event loop). The bound is a
  worst delay of 100 ms.

    python bench/ui_load.py [--samples 4] [--text 200] [--rounds 4]
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


def serve(runs: str, port: str, mode: str) -> None:
    """The server side (``--serve``): the page's app over ``runs`` as ``refinery ui``
    serves it, with trace pages drawn as ``mode`` says."""
    import uvicorn

    from refinery.ui import UISettings, create_ui_app

    settings = UISettings(runs=Path(runs), draw_in_process=mode == "process")
    uvicorn.run(create_ui_app(settings), host="127.0.0.1", port=int(port), log_level="warning")


def start(runs: Path, mode: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(runs), str(port), mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
    raise SystemExit(f"the {mode} server did not start")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server alone: its shutdown must end its drawing process too."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10  # multiprocessing's resource tracker exits just after
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)  # anything left of its session's group?
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    print(f"warning: processes of the server (pid {proc.pid}) outlived it by 10 s")


def timed_get(client: httpx.Client, path: str) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    r = client.get(path)
    r.raise_for_status()
    return time.perf_counter() - started, r


def static_alone(url: str, n: int = 50) -> list[float]:
    with httpx.Client(base_url=url, timeout=60) as h:
        return [timed_get(h, STATIC)[0] for _ in range(n)]


def static_during(url: str, page: str) -> tuple[float, list[float]]:
    """The render time of ``page`` and the static latencies measured meanwhile.

    The page is fetched by a process of its own (``--fetch``): read in this one, its
    10 MB would contend for this process's GIL with the probes, and their delays
    would be the bench's, not the server's.
    """
    fetch = subprocess.Popen([sys.executable, __file__, "--fetch", url + page],
                             stdout=subprocess.PIPE, text=True)
    waits = []
    try:
        assert fetch.stdout.readline().strip() == "asking"
        with httpx.Client(base_url=url, timeout=60) as h:
            while fetch.poll() is None:
                waits.append(timed_get(h, STATIC)[0])
                time.sleep(0.01)
        seconds = float(fetch.stdout.read())
    finally:
        fetch.kill()
        fetch.wait()
    return seconds, waits


def fetch(address: str) -> None:
    """The fetching side (``--fetch``): says when it asks, then how long the page took."""
    with httpx.Client(timeout=300) as h:
        print("asking", flush=True)
        seconds, _ = timed_get(h, address)
    print(seconds, flush=True)


def cpu() -> str:
    """The CPU as docs/benchmarks.md names it: lscpu's model and the flags that matter."""
    info = Path("/proc/cpuinfo").read_text()
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                      if ln.startswith("flags")), []))
    shown = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {', '.join(shown) or 'no AVX2'}"


def one_round(url: str, page: str, into: dict[str, list[float]]) -> None:
    """One round of a side: the page alone, the page with static probes, static alone."""
    with httpx.Client(base_url=url, timeout=300) as h:
        into["render"].append(timed_get(h, page)[0])
    seconds, waits = static_during(url, page)
    into["render"].append(seconds)
    into["during"] += waits
    # As many alone, right after: the machine's own floor for that many requests (on a
    # shared or virtual machine, the worst of a few hundred is the host's, not ours).
    into["alone"] += static_alone(url, len(waits))


def spread(seconds: list[float]) -> str:
    """Median, 99th percentile and worst, in ms."""
    ms = sorted(1000 * x for x in seconds)
    return (f"median {statistics.median(ms):.1f} ms, p99 {ms[int(0.99 * (len(ms) - 1))]:.1f} "
            f"ms, max {ms[-1]:.1f} ms ({len(ms)} requests)")


def report(mode: str, f: dict[str, list[float]]) -> None:
    render = statistics.median(f["render"])
    print(f"{mode}: first load {f['first'][0]:.2f} s, then median {render:.2f} s of "
          f"{len(f['render'])}")
    print(f"  static while the trace is drawn: {spread(f['during'])}; "
          f"worst / render {max(f['during']) / render:.2f}")
    print(f"  static alone, as many right after: {spread(f['alone'])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--samples", type=int, default=4, help="outputs per call")
    ap.add_argument("--text", type=int, default=200, help="characters per text")
    ap.add_argument("--rounds", type=int, default=4, help="per side, mirrored")
    # The bench's other processes: a server side, and the page's fetcher.
    ap.add_argument("--serve", nargs=3, metavar=("RUNS", "PORT", "MODE"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--fetch", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(*args.serve)
    if args.fetch:
        return fetch(args.fetch)
    with tempfile.TemporaryDirectory() as tmp:
        page = write_run(Path(tmp), args.samples, args.text)
        size = (Path(tmp) / "big" / "traces.jsonl").stat().st_size
        servers = {mode: start(Path(tmp), mode) for mode in ("process", "thread")}
        figures = {mode: {"first": [], "render": [], "during": [], "alone": []}
                   for mode in servers}
        try:
            for mode, (_, url) in servers.items():  # starts the worker, builds the index
                with httpx.Client(base_url=url, timeout=300) as h:
                    seconds, r = timed_get(h, page)
                figures[mode]["first"].append(seconds)
                html = len(r.content)
            for i in range(args.rounds):  # mirrored: process thread, thread process, ...
                for mode in ("process", "thread") if i % 2 == 0 else ("thread", "process"):
                    one_round(servers[mode][1], page, figures[mode])
        finally:
            for proc, _ in servers.values():
                stop(proc)
    print(f"cpu: {cpu()}")
    print(f"trace: {MAX_EVENTS:,} events, {size / 1e6:.1f} MB of JSON; page {html / 1e6:.1f} MB")
    for mode in ("process", "thread"):
        report(mode, figures[mode])
    ratio = max(figures["thread"]["during"]) / max(figures["process"]["during"])
    print(f"worst static delay, thread / process: {ratio:.1f}x (bound: process max <= 100 ms)")


if __name__ == "__main__":
    main()
