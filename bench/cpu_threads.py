"""vLLM's CPU thread binding: "auto" (one core kept for the scheduler) vs every core.

``VLLMBackend`` sets ``VLLM_CPU_OMP_THREADS_BIND`` to every CPU the process may
use unless the variable is already set. This bench is why: the same batched
workload (``bench/backend_throughput.py``'s backend phase, one fresh engine per
run) under each setting, alternated A B A B, compared as means. Prints
tokens/s per run and the ratio all-cores / auto.

    python bench/cpu_threads.py [--requests 256] [--max-tokens 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from refinery.engine.backends.vllm import all_cpus  # noqa: E402 (no vllm import)

sys.path.insert(0, str(HERE))
# The children are backend_throughput.py, which sets the same environment; ours
# overrides the binding under test.
from strategy_throughput import child_result  # noqa: E402


def one_run(bind: str, requests: int, max_tokens: int) -> float:
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": bind}
    r = child_result([sys.executable, str(HERE / "backend_throughput.py"), "--phase",
                      "backend", "--requests", str(requests), "--max-tokens",
                      str(max_tokens)], timeout=1800, env=env)
    return r["tokens"] / r["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    every = all_cpus()
    runs: dict[str, list[float]] = {"auto": [], every: []}
    for _ in range(a.rounds):
        for bind in runs:
            tok_s = one_run(bind, a.requests, a.max_tokens)
            runs[bind].append(tok_s)
            print(f"bind={bind:<8} {tok_s:8.1f} tok/s  (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    auto, allc = statistics.mean(runs["auto"]), statistics.mean(runs[every])
    print(f"\n{a.requests} requests x {a.max_tokens} tokens, greedy, means of {a.rounds}: "
          f"auto {auto:.1f} tok/s, cores {every} {allc:.1f} tok/s, ratio {allc / auto:.2f}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
