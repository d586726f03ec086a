"""Ray scale-out: the same eval run without Ray, on 1 Ray actor, and on K actors.

Each configuration runs in a fresh process (its engine's memory and threads, and
Ray's own processes, go away with it), alternated A B C A B C over ``--rounds``:

- ``local``: ``run_eval`` on one in-process engine (what ``refinery eval run`` does);
- ``ray-1``: the same run with ``--ray --replicas 1``: a Ray started for the run,
  one actor owning the engine, tasks and results crossing process boundaries;
- ``ray-K``: ``--replicas K`` (default 2), each engine bound to its share of the
  CPUs (on this 2-core machine, one core each).

Two rates per run: end to end (engine start included), and the solve phase
(completion tokens over the time after the engines were ready; Ray logs when
its actors are). Prints each, then ``ratio ray-1/local`` (what
Ray's plumbing costs) and ``ratio ray-K/local`` (what K engines buy here: on
2 cores two engines split the same compute, so expect about 1, not K).

Usage:
    python bench/ray_scaling.py [--problems 64] [--strategy "sc(cot, n=4)"] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(kind: str, args: argparse.Namespace, out: str) -> dict:
    from refinery.engine.backends.factory import make_backend
    from refinery.eval.ray_pool import RayOptions
    from refinery.eval.runner import EvalConfig, backend_spec, read_results, run_eval

    replicas = 0 if kind == "local" else int(kind.split("-")[1])
    cfg = EvalConfig(dataset="arith", strategy=args.strategy, limit=args.problems, out=out,
                     max_tokens=args.max_tokens, concurrency=args.concurrency,
                     ray=RayOptions(replicas=replicas) if replicas else None)
    ready: list[float] = []

    class Ready(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if hasattr(record, "ready_seconds"):
                ready.append(record.ready_seconds)

    pool_log = logging.getLogger("refinery.eval.ray_pool")
    pool_log.setLevel(logging.INFO)
    pool_log.addHandler(Ready())

    async def go() -> float:
        if replicas:
            await run_eval(cfg, progress=False)
            return ready[0]
        t = time.monotonic()
        backend = await make_backend(backend_spec(cfg))
        started = time.monotonic() - t
        try:
            await run_eval(cfg, backend=backend, progress=False)
        finally:
            await backend.aclose()
        return started

    t0 = time.monotonic()
    start = asyncio.run(go())
    wall = time.monotonic() - t0
    rows = read_results(Path(out) / "results.jsonl")
    tokens = sum(r["usage"]["completion_tokens"] for r in rows)
    return {"kind": kind, "problems": len(rows), "tokens": tokens, "wall": wall,
            "start": start, "e2e_tps": tokens / wall, "solve_tps": tokens / (wall - start)}


def run_child(kind: str, args: argparse.Namespace) -> dict:
    out = tempfile.mkdtemp(prefix=f"ray-scaling-{kind}-")
    try:
        cmd = [sys.executable, __file__, "--child", kind, "--out", out,
               "--problems", str(args.problems), "--strategy", args.strategy,
               "--max-tokens", str(args.max_tokens), "--concurrency", str(args.concurrency)]
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(out, ignore_errors=True)


def cpu_line() -> str:
    info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines()
                  if ln.startswith("Model name")), "?")
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in info]
    return f"{model}, {os.cpu_count()} CPUs, flags: {' '.join(flags)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=64)
    ap.add_argument("--strategy", default="sc(cot, n=4)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=64, help="problems in flight per engine")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args, args.out)))
        return
    kinds = ["local", "ray-1", f"ray-{args.replicas}"]
    print(f"CPU: {cpu_line()}")
    print(f"work: arith x {args.problems}, {args.strategy}, max_tokens {args.max_tokens}, "
          f"{args.concurrency} problems in flight per engine; {args.rounds} rounds A B C")
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for rnd in range(args.rounds):
        for kind in kinds:
            r = run_child(kind, args)
            runs[kind].append(r)
            print(f"round {rnd + 1} {kind:>6}: {r['tokens']} tokens, wall {r['wall']:.1f} s "
                  f"(engines ready after {r['start']:.1f} s): {r['e2e_tps']:.1f} tok/s end "
                  f"to end, {r['solve_tps']:.1f} tok/s solving", flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("e2e_tps", "solve_tps")}
           for k, v in runs.items()}
    for k in kinds[1:]:
        print(f"ratio {k}/local: solving {med[k]['solve_tps'] / med['local']['solve_tps']:.3f}, "
              f"end to end {med[k]['e2e_tps'] / med['local']['e2e_tps']:.3f} (medians)")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
