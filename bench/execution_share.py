"""How much of an execution strategy's wall time is the sandbox's.

Runs ``sc(pot, n=8)`` (``--spec``) on ``--tasks`` arith test problems at once on the
in-process engine, and records two sets of intervals in the same run: every
sandbox run as the strategy sees it (from the call to its result, waiting for a
worker included) and every model request in flight. Prints, over the run's wall
time:

- sandbox busy: some program running or queued;
- sandbox alone: some program running or queued while no model request is in
  flight, the time the run spends waiting for the sandbox and nothing else (what
  a faster sandbox would give back at most);
- the sum of all runs' latencies, and their p50/p95.

    python bench/execution_share.py [--tasks 64] [--spec "sc(pot, n=8)"]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from refinery.engine.backends.vllm import all_cpus  # noqa: E402 (no vllm import)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

Interval = tuple[float, float]


class Timed:
    """Wraps an async callable; keeps the (start, end) of every call."""

    def __init__(self, fn, spans: list[Interval]):
        self.fn, self.spans = fn, spans

    async def __call__(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return await self.fn(*args, **kwargs)
        finally:
            self.spans.append((t0, time.monotonic()))


def union(spans: list[Interval]) -> list[Interval]:
    """The spans merged where they overlap, in order."""
    out: list[Interval] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def covered(spans: list[Interval]) -> float:
    return sum(b - a for a, b in union(spans))


def alone(mine: list[Interval], others: list[Interval]) -> float:
    """Time inside ``mine`` and outside every span of ``others``."""
    gaps, t = [], float("-inf")
    for a, b in union(others):
        gaps.append((t, a))
        t = b
    gaps.append((t, float("inf")))
    total = 0.0
    for a, b in union(mine):
        for ga, gb in gaps:
            total += max(0.0, min(b, gb) - max(a, ga))
    return total


async def main(args: argparse.Namespace) -> None:
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.loops import CusumLoopDetector
    from refinery.engine.run import run
    from refinery.engine.types import SamplingParams
    from refinery.eval.datasets import load_arith
    from refinery.strategies import build
    from refinery.strategies.execution import execution_sandbox

    backend = await VLLMBackend.create()
    sandbox, runs, calls = execution_sandbox(), [], []
    sandbox.run_python = Timed(sandbox.run_python, runs)
    backend.generate = Timed(backend.generate, calls)
    tasks = [e.to_task() for e in load_arith(limit=args.tasks)]
    t0 = time.monotonic()
    await run(build(args.spec), tasks, backend, concurrency=args.tasks,
              params=SamplingParams(temperature=0.7, max_tokens=512),
              loop_detector=CusumLoopDetector())
    wall = time.monotonic() - t0
    await backend.aclose()
    lat = sorted(b - a for a, b in runs)
    print(f"{args.spec} on {args.tasks} arith problems at once: wall {wall:.1f} s, "
          f"{len(calls)} model requests, {len(runs)} sandbox runs")
    print(f"sandbox busy  {covered(runs) / wall:6.1%} of wall")
    print(f"sandbox alone {alone(runs, calls) / wall:6.1%} of wall (no model request in flight)")
    print(f"run latency   sum {sum(lat):.1f} s, p50 {statistics.median(lat) * 1000:.0f} ms, "
          f"p95 {lat[int(0.95 * (len(lat) - 1))] * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--spec", default="sc(pot, n=8)")
    asyncio.run(main(parser.parse_args()))
