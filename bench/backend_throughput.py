"""VLLMBackend (AsyncLLM, 64 concurrent callers) vs vLLM's own LLM.generate.

Same prompts, same greedy settings, same engine config, each engine in a fresh
child process; the two are run alternately (A B A B) and the best of each is
kept, to damp the noise of a shared machine. Prints tokens/s and the ratio
(a thin layer over the engine keeps at least 0.95).

    python bench/backend_throughput.py [--requests 64] [--max-tokens 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Sets the same vLLM environment (KV cache, cores) as the strategy bench; no vllm import.
from strategy_throughput import VLLMConfig, child_result, engine_kwargs  # noqa: E402

from refinery.engine.models import DEFAULT_MODEL  # noqa: E402

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

PROMPT = "Write a short story about a robot who learns to paint, number {i}."


def run_backend(n: int, max_tokens: int) -> dict:
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.types import Message, SamplingParams

    async def main() -> None:
        be = await VLLMBackend.create(DEFAULT_MODEL)
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        msgs = [[Message(role="user", content=PROMPT.format(i=i))] for i in range(n)]
        await be.generate(msgs[0], params)  # warm-up
        t0 = time.perf_counter()
        res = await asyncio.gather(*(be.generate(m, params) for m in msgs))
        dt = time.perf_counter() - t0
        await be.aclose()
        return {"tokens": sum(r[0].completion_tokens for r in res), "seconds": dt}

    return asyncio.run(main())


def run_llm(n: int, max_tokens: int) -> dict:
    from vllm import LLM, SamplingParams

    # VLLMBackend's settings, its dtype on this CPU included.
    llm = LLM(**engine_kwargs(DEFAULT_MODEL, VLLMConfig.max_num_batched_tokens))
    sp = SamplingParams(temperature=0, max_tokens=max_tokens)
    convs = [[{"role": "user", "content": PROMPT.format(i=i)}] for i in range(n)]
    llm.chat(convs[:1], sp, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    res = llm.chat(convs, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    return {"tokens": sum(len(r.outputs[0].token_ids) for r in res), "seconds": dt}


def measure(phase: str, n: int, max_tokens: int) -> dict:
    """One phase in a fresh interpreter (a fresh engine), result as the last stdout line."""
    result = child_result([sys.executable, __file__, "--phase", phase, "--requests", str(n),
                           "--max-tokens", str(max_tokens)], timeout=900)
    result["tok_s"] = result["tokens"] / result["seconds"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--phase", choices=["backend", "llm"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.phase:
        fn = run_backend if a.phase == "backend" else run_llm
        print("RESULT " + json.dumps(fn(a.requests, a.max_tokens)), flush=True)
        return
    ours, raw = [], []
    for _ in range(a.rounds):
        ours.append(measure("backend", a.requests, a.max_tokens))
        raw.append(measure("llm", a.requests, a.max_tokens))
    best_ours = max(ours, key=lambda r: r["tok_s"])
    best_raw = max(raw, key=lambda r: r["tok_s"])
    print(json.dumps({"VLLMBackend": ours, "LLM.generate": raw}, indent=1))
    print(f"VLLMBackend  {best_ours['tok_s']:7.1f} tok/s ({best_ours['tokens']} tokens)")
    print(f"LLM.generate {best_raw['tok_s']:7.1f} tok/s ({best_raw['tokens']} tokens)")
    print(f"ratio {best_ours['tok_s'] / best_raw['tok_s']:.3f}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
