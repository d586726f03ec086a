"""Server load: a concurrency sweep through refinery's OpenAI-compatible server,
and passthrough overhead against vLLM's own OpenAI server on the same model.

Each server runs as a subprocess on 127.0.0.1 with the same engine settings
(enforce-eager, max_model_len 4096). Requests are greedy, so both servers do
the same work. Prints a table (throughput, p50/p95 latency) and the ratio of
passthrough throughput at concurrency 16 against vLLM's own server.

    python bench/server_load.py [--requests 32] [--max-tokens 64] [--strategy "sc(cot, n=4)"]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from refinery.engine.backends.vllm import all_cpus
from refinery.engine.models import DEFAULT_MODEL

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
# vLLM's own engines get the same cores as VLLMBackend.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
MODEL = DEFAULT_MODEL
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, kind: str):
        self.port = free_port()
        if kind == "refinery":
            cmd = [str(BIN / "refinery"), "serve", "--port", str(self.port), "--model", MODEL,
                   "--max-concurrent-requests", "256"]
        else:
            from refinery.engine.models import resolve_model

            cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                   resolve_model(MODEL), "--served-model-name", MODEL, "--port", str(self.port),
                   "--host", "127.0.0.1", "--enforce-eager", "--max-model-len", "4096",
                   "--gpu-memory-utilization", "0.5", "--disable-log-stats"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited during start")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    return self.url + "/v1"
                if "starting" not in r.text:  # the engine failed: say why, stop the server
                    self.__exit__()
                    raise RuntimeError(f"server not ready: {r.text}")
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.__exit__()
        raise RuntimeError("server not ready")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def load(base_url: str, model: str, concurrency: int, requests: int,
               max_tokens: int) -> dict:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0,
                                timeout=900)
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        async with sem:
            t0 = time.perf_counter()
            r = await client.chat.completions.create(
                model=model, temperature=0, max_tokens=max_tokens, messages=[
                    {"role": "user", "content": f"Explain in a few sentences fact number {i} "
                                                "about the ocean."}])
            lat.append(time.perf_counter() - t0)
            tokens += r.usage.completion_tokens

    await one(-1)  # warm-up
    lat.clear()
    tokens = 0
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    wall = time.perf_counter() - t0
    await client.close()
    lat.sort()
    return {"tok_s": tokens / wall, "req_s": requests / wall,
            "p50": statistics.median(lat), "p95": lat[max(0, int(0.95 * len(lat)) - 1)]}


def row(name: str, c: int, r: dict) -> str:
    return (f"| {name} | {c} | {r['tok_s']:.1f} | {r['req_s']:.2f} | {r['p50']:.2f} | "
            f"{r['p95']:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--strategy", default="sc(cot, n=4)")
    a = ap.parse_args()
    lines = ["| server / model | concurrency | tokens/s | req/s | p50 s | p95 s |",
             "|---|---|---|---|---|---|"]
    ours16 = []
    with Server("refinery") as url:
        for c in (1, 4, 16, 32):
            n = max(a.requests // 4, c) if c == 1 else a.requests
            r = asyncio.run(load(url, MODEL, c, n, a.max_tokens))
            lines.append(row("refinery passthrough", c, r))
            if c == 16:
                ours16.append(r)
        for c in (1, 4, 16, 32):
            n = max(a.requests // 4, c) if c == 1 else a.requests
            r = asyncio.run(load(url, f"{a.strategy}@{MODEL}", c, n, a.max_tokens))
            lines.append(row(f"refinery {a.strategy}", c, r))
    # Interleaved A B A B, each side's mean compared: damps drift on a shared box.
    vllm16 = []
    for kind in ("vllm", "refinery", "vllm"):
        with Server(kind) as url:
            r = asyncio.run(load(url, MODEL, 16, a.requests, a.max_tokens))
        (vllm16 if kind == "vllm" else ours16).append(r)
        if kind == "vllm":
            lines.append(row("vLLM OpenAI server", 16, r))
    print("\n".join(lines))
    ours = statistics.mean(r["tok_s"] for r in ours16)
    theirs = statistics.mean(r["tok_s"] for r in vllm16)
    print(f"\npassthrough at concurrency 16 (mean of 2 runs each, interleaved): refinery "
          f"{ours:.1f} tok/s vs vLLM server {theirs:.1f} tok/s -> ratio {ours / theirs:.3f} "
          f"; runs: refinery "
          f"{[round(r['tok_s'], 1) for r in ours16]}, vLLM "
          f"{[round(r['tok_s'], 1) for r in vllm16]}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
