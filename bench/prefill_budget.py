"""Scheduler budget: ``max_num_batched_tokens`` 2048 (vLLM's engine default) vs 4096.

The same strategy run (default ``ssr`` over 16 GSM8K tasks, 256 new tokens) on a
fresh ``VLLMBackend`` per setting, alternated A B A B; prints generated tokens/s per
run and the ratio of the means (4096 / 2048).

    python bench/prefill_budget.py [--spec ssr] [--tasks 16] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
# The same tasks and engine environment as the strategy bench.
from strategy_throughput import child_result, load_tasks  # noqa: E402


async def one(spec: str, todo: list, budget: int, max_tokens: int) -> dict:
    from refinery import strategies
    from refinery.engine.backends.vllm import VLLMBackend, VLLMConfig
    from refinery.engine.run import run
    from refinery.engine.types import SamplingParams

    backend = await VLLMBackend.create(config=VLLMConfig(max_num_batched_tokens=budget))
    try:
        params = SamplingParams(max_tokens=max_tokens)
        t0 = time.monotonic()
        traces = await run(strategies.build(spec, max_calls=None), todo, backend,
                           concurrency=len(todo), params=params)
        wall = time.monotonic() - t0
    finally:
        await backend.aclose()
    return {"tokens": sum(t.usage.completion_tokens for t in traces), "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="ssr")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget", type=int, help=argparse.SUPPRESS)  # internal: one run
    a = ap.parse_args()
    if a.budget:
        r = asyncio.run(one(a.spec, load_tasks(a.tasks), a.budget, a.max_tokens))
        print("RESULT " + json.dumps(r), flush=True)
        return
    runs: dict[int, list[float]] = {2048: [], 4096: []}
    for _ in range(a.rounds):
        for budget in runs:
            r = child_result([sys.executable, __file__, "--budget", str(budget), "--spec",
                              a.spec, "--tasks", str(a.tasks), "--max-tokens",
                              str(a.max_tokens)])
            runs[budget].append(r["tokens"] / r["wall"])
            print(f"budget {budget}: {r['tokens']} tokens in {r['wall']:.1f}s = "
                  f"{runs[budget][-1]:.1f} tok/s (load {os.getloadavg()[0]:.1f})", flush=True)
    lo, hi = statistics.mean(runs[2048]), statistics.mean(runs[4096])
    print(f"\n{a.spec}, {a.tasks} tasks, means of {a.rounds}: 2048 {lo:.1f} tok/s, "
          f"4096 {hi:.1f} tok/s, ratio {hi / lo:.2f}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
