"""Adaptive self-consistency against the full vote: tokens, wall time, agreement.

One in-process engine. Per dataset (arith, GSM8K test; ``--limit`` problems each)
and inner strategy (``--inners``, e.g. ``cot pot``), three runs over all problems
at once (``engine.run``, loop policy ``truncate``; bench/deepconf.py's runner):

1. **sc**: ``sc(INNER, n=N)``, the full vote;
2. **asc**: ``asc(INNER, max_n=N)`` with its defaults (or ``--asc`` settings);
3. **sc again**: a second, independent ``sc(INNER, n=N)``. How often its vote
   agrees with the first is the stability of the full vote itself: no stopping
   rule can agree with a vote more often than the vote agrees with itself.

For a ``cot`` inner the second vote's N samples are drawn in one request and
kept in order, and asc's own rule (``AdaptiveSelfConsistency.verdict``) is
replayed on them one by one: its agreement with the vote of those same samples
and the share of their tokens it reads, where sampling noise cannot blur it,
for both tests (``against`` rest and runner-up).

Agreement: asc's answer is a top answer of the full vote (on a tie any tied
answer, as bench/deepconf.py counts it), over all problems and over those the
full vote decided (one top answer, held by two samples or more).

    nice -n 10 python bench/adaptive_sc.py --limit 200 --inners cot pot
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepconf import (  # noqa: E402
    DATASETS,
    MethodRun,
    acc,
    agreement,
    agrees,
    decided,
    key,
    load,
    majority,
    run_spec,
    tally_of,
)

from refinery.engine.types import Attempt, SamplingParams  # noqa: E402
from refinery.strategies.adaptive_sc import AdaptiveSelfConsistency  # noqa: E402
from refinery.strategies.cot import CoT  # noqa: E402


@dataclass(frozen=True)
class Sample:
    answer: str | None
    tokens: int


async def draw(examples: list, backend, params: SamplingParams, n: int) -> list[list[Sample]]:
    """``n`` cot samples per example in one request each, in the engine's order."""
    from refinery.engine.context import Context
    from refinery.engine.loops import CusumLoopDetector
    from refinery.verifiers.math import extract_answer

    async def one(ex) -> list[Sample]:
        ctx = Context(backend, loop_detector=CusumLoopDetector(), loop_policy="truncate")
        gen = await ctx.generate(CoT().messages(ex.to_task()), params, n=n)
        return [Sample(extract_answer(c.text), c.completion_tokens) for c in gen]

    return list(await asyncio.gather(*(one(ex) for ex in examples)))


def replay(samples: Sequence[Sample], asc: AdaptiveSelfConsistency) -> tuple[str, int]:
    """asc's rule on pre-drawn samples, one at a time: its answer and the tokens read."""
    pool: list[Attempt] = []
    for s in samples:
        pool.append(Attempt(text="", answer=s.answer))
        if asc.verdict(pool) is not None:
            break
    return majority([a.answer for a in pool]), sum(s.tokens for s in samples[:len(pool)])


def report_replay(pool: list[list[Sample]], first: MethodRun, n: int) -> None:
    votes = [tally_of([s.answer for s in samples]) for samples in pool]
    total = sum(s.tokens for samples in pool for s in samples)
    print(f"stability, the second vote's majority a top answer of the first's: "
          f"{agreement([majority([s.answer for s in ss]) for ss in pool], first.votes)}")
    # Where the full vote is stable: both votes decided, on the same answer.
    stable = [i for i, v in enumerate(votes) if decided(v) and decided(first.votes[i])
              and agrees(majority([s.answer for s in pool[i]]), first.votes[i])]
    stable_total = sum(s.tokens for i in stable for s in pool[i])
    print(f"stable problems (both votes decided, on one answer): {len(stable)}")
    for against in ("rest", "runner_up"):
        rule = AdaptiveSelfConsistency(CoT(), max_n=n, against=against)
        reps = [replay(samples, rule) for samples in pool]
        used = sum(t for _, t in reps)
        print(f"replay against={against}: agreement with the same samples' vote "
              f"{agreement([a for a, _ in reps], votes)}; tokens {used / max(1, total):.2f}"
              f" of the vote's")
        if stable:
            print(f"  on the stable ones: agreement "
                  f"{agreement([reps[i][0] for i in stable], [votes[i] for i in stable])}; "
                  f"tokens {sum(reps[i][1] for i in stable) / max(1, stable_total):.2f}")


def report(dataset: str, inner: str, sc: MethodRun, asc: MethodRun, again: MethodRun | None,
           n: int) -> None:
    print(f"\n== {dataset}, {inner}: {len(sc.answers)} problems, N={n}")
    for r in (sc, asc, *([again] if again else [])):
        print(f"{r.name:9s} tokens {r.tokens:8d}  wall {r.seconds:7.1f}s  "
              f"accuracy {acc(r.passed)}")
    print(f"asc / sc: tokens {asc.tokens / max(1, sc.tokens):.2f} "
          f"({1 - asc.tokens / max(1, sc.tokens):+.0%} saved), "
          f"wall {asc.seconds / sc.seconds:.2f}")
    print(f"agreement, asc's answer a top answer of sc's vote: "
          f"{agreement(asc.answers, sc.votes)}")
    if again is not None:
        print(f"stability, a second sc's answer a top answer of the first's: "
              f"{agreement(again.answers, sc.votes)}")


async def one_inner(a: argparse.Namespace, backend, dataset: str, inner: str) -> dict:
    examples = load(dataset, a.limit)
    params = SamplingParams(temperature=a.temperature, max_tokens=a.max_tokens)
    sc = await run_spec("sc", f"sc({inner}, n={a.n})", examples, backend, params)
    asc = await run_spec("asc", f"asc({inner}, max_n={a.n}{a.asc})", examples, backend,
                         params)
    if inner == "cot":
        report(dataset, inner, sc, asc, None, a.n)
        pool = await draw(examples, backend, params, a.n)
        report_replay(pool, sc, a.n)
        stable = [key(majority([s.answer for s in ss])) for ss in pool]
    else:
        again = await run_spec("sc again", f"sc({inner}, n={a.n})", examples, backend, params)
        report(dataset, inner, sc, asc, again, a.n)
        stable = again.answers
    return {"sc": sc.__dict__, "asc": asc.__dict__, "second_vote": stable}


async def main(a: argparse.Namespace) -> dict:
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.models import DEFAULT_MODEL

    backend = await VLLMBackend.create(DEFAULT_MODEL)
    print(f"engine: {DEFAULT_MODEL}, {backend.dtype.dtype if backend.dtype else '?'}; "
          f"max_tokens {a.max_tokens}, temperature {a.temperature}")
    out = {}
    try:
        for dataset in a.datasets:
            for inner in a.inners:
                out[f"{dataset}/{inner}"] = await one_inner(a, backend, dataset, inner)
    finally:
        await backend.aclose()
    return out


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=200, help="problems per dataset")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--inners", nargs="+", default=["cot", "pot"])
    ap.add_argument("--n", type=int, default=16, help="sc's samples, asc's max_n")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--asc", default="", help="more asc params, e.g. ', against=\"runner_up\"'")
    ap.add_argument("--save", help="write answers and votes to this JSON file")
    args = ap.parse_args()
    results = asyncio.run(main(args))
    if args.save:
        Path(args.save).write_text(json.dumps(results, default=str))
