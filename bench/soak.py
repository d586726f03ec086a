"""Load and soak: 32 concurrent clients against ``refinery serve`` (embedded model) for minutes.

Starts ``refinery serve`` as a subprocess on 127.0.0.1 (in-process vLLM, the
embedded SmolLM2-135M), then drives ``--clients`` official ``AsyncOpenAI``
clients in a closed loop for ``--minutes``: each client cycles through a plain
passthrough chat call, a streamed passthrough call and a cheap strategy
(``sc(cot, n=2)`` through the ``SPEC@model`` name). SDK retries are off, so
every failure is counted.

Per request it records the outcome: an error (any exception or HTTP error), a
lost response (no exception, but an empty answer or no ``finish_reason``; for a
stream: no final chunk), or ok, with its latency. Every ``--sample`` seconds it
records the resident memory (RSS) of the server process plus all its
descendants (vLLM's engine core runs in a child).

The verdict is PASS when there was no error, no lost response, and memory is
flat: the mean RSS of the last window is within ``--rss-bound`` (default 10%)
of the mean RSS of the baseline window. Windows are one minute long (the second
minute is the baseline: the first is warm-up); for runs shorter than 3 minutes
each window is a third of the run.

    python bench/soak.py --minutes 10           # the soak
    python bench/soak.py --minutes 1            # a quick validation of the script
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import openai

from refinery.engine.models import DEFAULT_MODEL

MODEL = DEFAULT_MODEL
BIN = Path(sys.executable).parent
KINDS = ("passthrough", "stream", "sc")
PROMPTS = [f"What is {a} + {b}? Answer with the number." for a, b in
           [(17, 25), (3, 9), (120, 44), (8, 8), (61, 39), (250, 250), (7, 35), (99, 1)]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every descendant (from /proc)."""
    return sum(tree_rss_by_process(pid).values())


def tree_rss_by_process(pid: int) -> dict[str, int]:
    """Resident bytes of ``pid`` and each descendant, keyed ``pid:name``: shows
    whether growth is the API server's heap or the engine touching its KV cache."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out: dict[str, int] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            status = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:
            continue
        name = next((ln.split(None, 1)[1] for ln in status if ln.startswith("Name:")), "?")
        rss = next((int(ln.split()[1]) * 1024 for ln in status if ln.startswith("VmRSS:")), 0)
        out[f"{p}:{name.strip()}"] = rss
    return out


@dataclass
class Outcome:
    kind: str
    status: str  # ok | error | lost
    seconds: float
    detail: str = ""


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Server:
    """``refinery serve`` in its own session, logging to a file."""

    def __init__(self, max_concurrent: int) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="refinery-soak-", suffix=".log")[1])
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE", "2"), "VLLM_LOGGING_LEVEL": "WARNING"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "refinery"), "serve", "--port", str(self.port), "--model", MODEL,
                 "--max-concurrent-requests", str(max_concurrent)],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited during start:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            time.sleep(1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Its own session: the group holds the server and vLLM's engine core only.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


async def one_request(client: openai.AsyncOpenAI, kind: str, prompt: str,
                      max_tokens: int, strategy: str) -> Outcome:
    t0 = time.monotonic()
    messages = [{"role": "user", "content": prompt}]
    try:
        if kind == "stream":
            text, finish, chunks = [], None, 0
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.0,
                stream=True)
            async for chunk in stream:
                chunks += 1
                for ch in chunk.choices:
                    text.append(ch.delta.content or "")
                    finish = ch.finish_reason or finish
            answer = "".join(text)
        else:
            model = MODEL if kind == "passthrough" else f"{strategy}@{MODEL}"
            resp = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=0.7)
            choice = resp.choices[0] if resp.choices else None
            answer = (choice.message.content or "") if choice else ""
            finish = choice.finish_reason if choice else None
    except Exception as exc:  # every failure counts; the SDK's own retries are off
        return Outcome(kind, "error", time.monotonic() - t0, f"{type(exc).__name__}: {exc}"[:300])
    dt = time.monotonic() - t0
    if not answer.strip() or not finish:
        return Outcome(kind, "lost", dt, f"answer={answer[:80]!r} finish_reason={finish!r}")
    return Outcome(kind, "ok", dt)


async def drive(url: str, server_pid: int, args: argparse.Namespace) -> dict:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0,
                                timeout=args.request_timeout)
    outcomes: list[Outcome] = []
    rss: list[tuple[float, int]] = []
    t_start = time.monotonic()
    deadline = t_start + args.minutes * 60

    async def client_loop(cid: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            kind = KINDS[(cid + i) % len(KINDS)]
            outcomes.append(await one_request(client, kind, PROMPTS[(cid * 7 + i) % len(PROMPTS)],
                                              args.max_tokens, args.strategy))
            i += 1

    async def sampler() -> None:
        while True:
            rss.append((time.monotonic() - t_start, tree_rss(server_pid)))
            await asyncio.sleep(args.sample)

    by_process_first = tree_rss_by_process(server_pid)
    sample_task = asyncio.ensure_future(sampler())
    last_report = t_start
    clients = [asyncio.ensure_future(client_loop(c)) for c in range(args.clients)]
    while not all(c.done() for c in clients):
        await asyncio.sleep(1)
        if time.monotonic() - last_report >= 60:
            last_report = time.monotonic()
            errs = sum(o.status != "ok" for o in outcomes)
            print(f"  t={last_report - t_start:5.0f}s requests={len(outcomes)} "
                  f"not ok={errs} rss={rss[-1][1] / 2**20:.0f} MiB", flush=True)
    await asyncio.gather(*clients)
    rss.append((time.monotonic() - t_start, tree_rss(server_pid)))
    sample_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sample_task
    await client.close()
    by_process_last = tree_rss_by_process(server_pid)
    print("RSS by process, MiB (first -> last):", {
        k: (round(by_process_first.get(k, 0) / 2**20), round(v / 2**20))
        for k, v in by_process_last.items() if v > 2**26}, flush=True)
    return summarize(outcomes, rss, time.monotonic() - t_start, args)


def summarize(outcomes: list[Outcome], rss: list[tuple[float, int]], seconds: float,
              args: argparse.Namespace) -> dict:
    lat = [o.seconds for o in outcomes if o.status == "ok"]
    per_kind = {}
    for k in KINDS:
        ks = [o.seconds for o in outcomes if o.kind == k and o.status == "ok"]
        per_kind[k] = {"requests": sum(o.kind == k for o in outcomes), "ok": len(ks),
                       "p50_s": round(pct(ks, 0.5), 3), "p95_s": round(pct(ks, 0.95), 3)}
    # Windows: minute 2 (baseline) vs the last minute; a third of the run each when short.
    win = 60.0 if seconds >= 180 else seconds / 3
    base = [b for t, b in rss if win <= t < 2 * win] or [rss[0][1]]
    last = [b for t, b in rss if t >= seconds - win] or [rss[-1][1]]
    base_mb, last_mb = statistics.mean(base) / 2**20, statistics.mean(last) / 2**20
    drift = (last_mb - base_mb) / base_mb
    errors = [o for o in outcomes if o.status == "error"]
    lost = [o for o in outcomes if o.status == "lost"]
    ok = not errors and not lost and drift <= args.rss_bound
    return {
        "seconds": round(seconds, 1), "clients": args.clients, "requests": len(outcomes),
        "ok": len(lat), "errors": len(errors), "lost": len(lost),
        "throughput_rps": round(len(outcomes) / seconds, 2),
        "p50_s": round(pct(lat, 0.5), 3), "p95_s": round(pct(lat, 0.95), 3),
        "per_kind": per_kind,
        "rss_mib": {"first": round(rss[0][1] / 2**20, 1), "last": round(rss[-1][1] / 2**20, 1),
                    "max": round(max(b for _, b in rss) / 2**20, 1),
                    "baseline_window_mean": round(base_mb, 1),
                    "last_window_mean": round(last_mb, 1), "window_s": round(win, 1),
                    "drift": round(drift, 4), "bound": args.rss_bound,
                    "samples": [(round(t), round(b / 2**20, 1)) for t, b in rss]},
        "first_errors": [asdict(o) for o in (errors + lost)[:5]],
        "verdict": "PASS" if ok else "FAIL",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--strategy", default="sc(cot, n=2)")
    ap.add_argument("--sample", type=float, default=10.0, help="RSS sampling period (s)")
    ap.add_argument("--rss-bound", type=float, default=0.10,
                    help="max relative RSS growth, last window vs baseline window")
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()

    server = Server(max_concurrent=max(64, 2 * args.clients))
    try:
        t0 = time.monotonic()
        server.wait_ready()
        print(f"refinery serve ready on {server.url} in {time.monotonic() - t0:.0f}s "
              f"(log {server.log}); {args.clients} clients for {args.minutes:g} min", flush=True)
        summary = asyncio.run(drive(server.url, server.proc.pid, args))
        alive = server.proc.poll() is None
    finally:
        server.stop()
    summary["server_alive_at_end"] = alive
    if not alive:
        summary["verdict"] = "FAIL"
    r = summary["rss_mib"]
    print(f"requests={summary['requests']} ok={summary['ok']} errors={summary['errors']} "
          f"lost={summary['lost']} throughput={summary['throughput_rps']} req/s "
          f"p50={summary['p50_s']}s p95={summary['p95_s']}s")
    for k, v in summary["per_kind"].items():
        print(f"  {k:12} requests={v['requests']} ok={v['ok']} p50={v['p50_s']}s "
              f"p95={v['p95_s']}s")
    print(f"RSS (server + children) MiB: first={r['first']} last={r['last']} max={r['max']} "
          f"baseline-window mean={r['baseline_window_mean']} last-window mean="
          f"{r['last_window_mean']} drift={100 * r['drift']:+.1f}% "
          f"(bound +{100 * r['bound']:.0f}%, windows of {r['window_s']}s)")
    print("RSS samples (s, MiB):", r["samples"])
    for e in summary["first_errors"]:
        print("  not ok:", e)
    print(f"verdict: {summary['verdict']}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    if summary["verdict"] == "PASS":  # keep the server log of a failed soak
        server.log.unlink(missing_ok=True)
    return 0 if summary["verdict"] == "PASS" else 1


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    sys.exit(main())
