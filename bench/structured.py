"""Constrained against free generation on the same engine: tokens/s and time to first token.

Every structured step of a strategy pays for its constraint: vLLM compiles the
grammar (xgrammar; cached per schema) and masks the vocabulary at every step.
This bench puts a number on it. One ``VLLMBackend`` (refinery's own engine,
default settings), the first ``--prompts`` GSM8K questions sent at once as
streams, ``--max-tokens`` each at temperature 0.8, in rounds alternating
free, constrained, free, constrained (same engine, so the machine's noise hits
both sides alike). The constraint is what a structured solver asks for: a JSON
object with a bounded ``reasoning`` string and an integer ``answer``.

A constrained sample is usually shorter than a free one (it closes its JSON
and stops), and a batch whose samples finish early runs emptier, so tokens/s of
free-length samples mixes the constraint's cost with the batch's shape. So each
round has a third side, **matched**: the same prompts unconstrained, each capped
at the token count its constrained sample had in that round. Free text is
usually longer than that cap (the matched side made 0.83 of the constrained
side's tokens on 2 Dec), so both sides generate nearly the same tokens per
request and mostly only the constraint differs.

Prints per side the tokens generated, tokens/s (all tokens over the round's
wall time), median and p90 time to first token, and the share of constrained
samples that are valid JSON under the schema; then ``ratio constrained/matched``
of tokens/s (the constraint's per-token cost) and
``ratio constrained/free`` (what free-length work would see).

    python bench/structured.py [--prompts 64] [--max-tokens 256] [--rounds 2]
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
# Sets the same vLLM environment (KV cache, cores) as the other benches.
from strategy_throughput import DATA  # noqa: E402

from refinery.engine.backends.vllm import VLLMBackend  # noqa: E402
from refinery.engine.constraints import Constraint  # noqa: E402
from refinery.engine.hardware import CpuInfo, cpu_dtype  # noqa: E402
from refinery.engine.types import Message, SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["reasoning", "answer"],
          "properties": {"reasoning": {"type": "string", "maxLength": 200},
                         "answer": {"type": "integer"}}}
SIDES = ("free", "constrained", "matched")


async def one(backend: VLLMBackend, msgs: list[Message], params: SamplingParams) -> dict:
    """Stream one request; its first-token delay, token count and text."""
    t0 = time.perf_counter()
    first, last = None, None
    async for d in backend.stream(msgs, params):
        if first is None and d.text:
            first = time.perf_counter() - t0
        last = d
    comp = last.completion
    return {"ttft": first if first is not None else float("nan"),
            "tokens": comp.completion_tokens, "text": comp.text}


async def round_of(backend: VLLMBackend, convs: list[list[Message]], side: str,
                   caps: list[int]) -> dict:
    """All prompts at once on one side, prompt i capped at ``caps[i]`` tokens."""
    c = Constraint.from_schema(SCHEMA, name="solution") if side == "constrained" else None
    params = [SamplingParams(temperature=0.8, max_tokens=cap, constraint=c) for cap in caps]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(one(backend, m, p) for m, p in zip(convs, params, strict=True)))
    seconds = time.perf_counter() - t0
    tokens = sum(o["tokens"] for o in outs)
    ttfts = sorted(o["ttft"] for o in outs)
    valid = sum(c.accepts(o["text"]) for o in outs) if c else None
    return {"side": side, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "ttft_p50": statistics.median(ttfts), "ttft_p90": ttfts[int(0.9 * len(ttfts))],
            "valid": valid, "n": len(outs), "lengths": [o["tokens"] for o in outs]}


def questions(n: int) -> list[list[Message]]:
    with DATA.open() as f:
        rows = [json.loads(line)["question"] for _, line in zip(range(n), f, strict=False)]
    return [[Message(role="user", content=q + "\nReply as JSON with your reasoning "
                     "and the integer answer.")] for q in rows]


async def run(prompts: int, max_tokens: int, rounds: int) -> list[dict]:
    backend = await VLLMBackend.create()
    try:
        convs = questions(prompts)
        for side in SIDES[:2]:  # warm-up: first grammar compile, first batch
            await round_of(backend, convs[:4], side, [16] * 4)
        results = []
        for r in range(rounds):
            caps = [max_tokens] * len(convs)
            for side in SIDES:
                res = await round_of(backend, convs, side, caps)
                if side == "constrained":  # the matched side gets these lengths
                    caps = [max(1, n) for n in res["lengths"]]
                print(f"round {r + 1} {side:<12} {res['tokens']:>6} tokens "
                      f"{res['tok_s']:7.1f} tok/s  ttft p50 {res['ttft_p50']:.2f} s", flush=True)
                results.append(res)
        return results
    finally:
        await backend.aclose()


def report(results: list[dict], cpu: CpuInfo) -> None:
    print(f"\nCPU: {cpu.model}; {cpu_dtype(cpu).log_line()}")
    rate = {}
    for side in SIDES:
        rs = [r for r in results if r["side"] == side]
        rate[side] = statistics.mean(r["tok_s"] for r in rs)
        ttft = statistics.mean(r["ttft_p50"] for r in rs)
        p90 = statistics.mean(r["ttft_p90"] for r in rs)
        valid = (f", valid JSON {sum(r['valid'] for r in rs)}/{sum(r['n'] for r in rs)}"
                 if side == "constrained" else "")
        print(f"{side:<12} {rate[side]:7.1f} tok/s, "
              f"{statistics.mean(r['tokens'] for r in rs):.0f} tokens/round, "
              f"ttft p50 {ttft:.2f} s p90 {p90:.2f} s{valid}")
    print(f"ratio constrained/matched {rate['constrained'] / rate['matched']:.3f} "
          "(the per-token cost at the same lengths)")
    print(f"ratio constrained/free {rate['constrained'] / rate['free']:.3f} "
          "(free-length samples: longer, so fuller batches)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    results = asyncio.run(run(a.prompts, a.max_tokens, a.rounds))
    report(results, CpuInfo.read())


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    main()
