"""Short calls under the loop detector: streamed apart, or one request checked whole.

A sample the loop detector may stop must be stopped alone, so both backends used
to run every watched sample as its own streamed request (behind a vLLM server,
one SSE chunk a token). Since the CUSUM detector stops a whole text where it
stops the same text streamed, a call whose ``max_tokens`` is at most
``whole_check_max_tokens`` is now one n-sample request whose samples are checked
when they end (``engine/backends/fan_out.py``: ``may_check_after_end``, which
says why). This bench measures what
that buys and what it costs, ``--backend openai``: one vLLM OpenAI server
(refinery's engine settings and dtype, ``bench/vs_optillm.py``) and
``OpenAIBackend`` in this process; ``--backend vllm``: ``VLLMBackend`` in this
process, its prefix cache emptied before each pass. The work is
``sc(cot, n=5)`` on the first ``--questions`` GSM8K test questions,
``--concurrency`` tasks at once, the loop detector on (retry policy, as the server
runs it), every watched sample streamed (``whole_check_max_tokens=None``) or every
call checked whole (the limit set to the pass's ``max_tokens``), alternated A B B A
per ``--max-tokens`` value. Prints per side the wall seconds, the tokens generated
(the server's count; in-process, the completion tokens of the traces, which count
every token up to a stop), the loop stops found and the accuracy, and
``ratio whole/streamed`` of the mean walls. The backends' default limit is the
longest ``max_tokens`` at which the whole check won here.

    python bench/whole_check.py [--backend openai|vllm] [--questions 32]
                                [--max-tokens 128 512] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vs_optillm as vo  # noqa: E402  (sets the vLLM environment of the other benches)

from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig  # noqa: E402
from refinery.engine.backends.vllm import VLLMBackend  # noqa: E402
from refinery.engine.loops import CusumLoopDetector  # noqa: E402
from refinery.engine.models import DEFAULT_MODEL  # noqa: E402
from refinery.engine.run import run  # noqa: E402
from refinery.engine.types import SamplingParams  # noqa: E402

SPEC = "sc(cot, n=5)"
SIDES = ("streamed", "whole")


@dataclass
class Pass:
    """One timed pass: its wall, the tokens generated (the server's count, or in-process
    the traces' completion tokens), loop stops, right answers."""

    side: str
    max_tokens: int
    wall: float
    generated: float
    loops: int
    correct: int


async def one_pass(side: str, max_tokens: int, examples, engine: VLLMBackend | None,
                   a: argparse.Namespace) -> Pass:
    """One timed pass of every question, on ``engine`` or else on the vLLM server;
    the engine's prefix cache emptied first."""
    from refinery.strategies.registry import REGISTRY
    from refinery.strategies.spec import build_strategy
    from refinery.verifiers.math import extract_answer, is_equivalent

    limit = None if side == "streamed" else max_tokens
    if engine is not None:
        await engine.engine.reset_prefix_cache()
        engine.whole_check_max_tokens, backend = limit, engine
    else:
        async with httpx.AsyncClient(timeout=30) as http:
            (await http.post(vo.url("vllm", "/reset_prefix_cache"))).raise_for_status()
        backend = OpenAIBackend(DEFAULT_MODEL, vo.url("vllm"),
                                config=OpenAIConfig(whole_check_max_tokens=limit))
        before = vo.scrape(vo.url("vllm", "/metrics"), vo.GEN_TOKENS)
    strategy, _ = build_strategy(SPEC, REGISTRY)
    t0 = time.perf_counter()
    traces = await run(strategy, [e.to_task() for e in examples], backend,
                       concurrency=a.concurrency, params=SamplingParams(max_tokens=max_tokens),
                       loop_detector=CusumLoopDetector(), spec=SPEC)
    wall = time.perf_counter() - t0
    if engine is None:
        await backend.aclose()
        generated = vo.scrape(vo.url("vllm", "/metrics"), vo.GEN_TOKENS) - before
    else:
        generated = sum(t.usage.completion_tokens for t in traces)
    loops = sum(c.finish_reason == "loop" for t in traces for e in t.events
                for c in e.completions or [])
    correct = sum(t.attempt is not None
                  and is_equivalent(extract_answer(t.attempt.text), e.gold)
                  for t, e in zip(traces, examples, strict=True))
    return Pass(side, max_tokens, wall, generated, loops, correct)


def report(passes: list[Pass], a: argparse.Namespace) -> None:
    where = "one vLLM server" if a.backend == "openai" else "in-process engine"
    print(f"\n{SPEC} on {a.questions} GSM8K questions, {a.concurrency} at once, "
          f"loop detector on, {where}")
    print(f"{'max_tokens':>10} {'side':<9} {'wall s (each)':<22} {'generated':>10} "
          f"{'loops':>6} {'right':>6}")
    for mt in a.max_tokens:
        walls = {}
        for side in SIDES:
            ps = [p for p in passes if p.max_tokens == mt and p.side == side]
            walls[side] = statistics.mean(p.wall for p in ps)
            each = " ".join(f"{p.wall:.1f}" for p in ps)
            print(f"{mt:>10} {side:<9} {each:<22} "
                  f"{statistics.mean(p.generated for p in ps):>10.0f} "
                  f"{sum(p.loops for p in ps):>6} {sum(p.correct for p in ps):>6}")
        print(f"{mt:>10} ratio whole/streamed {walls['whole'] / walls['streamed']:.3f}")


async def passes(examples, a: argparse.Namespace) -> list[Pass]:
    engine = await VLLMBackend.create(DEFAULT_MODEL) if a.backend == "vllm" else None
    try:
        for side in SIDES:  # untimed: first-use costs land on neither side
            await one_pass(side, 64, examples[:4], engine, a)
        out = []
        for rnd in range(a.rounds):
            for mt in a.max_tokens:
                for side in (SIDES if rnd % 2 == 0 else SIDES[::-1]):
                    out.append(await one_pass(side, mt, examples, engine, a))
                    print(out[-1], flush=True)
        return out
    finally:
        if engine is not None:
            await engine.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--backend", choices=["openai", "vllm"], default="openai")
    a = ap.parse_args()
    from refinery.eval.datasets import load_gsm8k

    examples = load_gsm8k(limit=a.questions)
    if a.backend == "vllm":
        report(asyncio.run(passes(examples, a)), a)
        return
    logdir = Path(tempfile.mkdtemp(prefix="whole-check-"))
    server = vo.vllm_server(logdir)
    try:
        server.wait_ready(vo.url("vllm", "/health"))
        report(asyncio.run(passes(examples, a)), a)
    finally:
        server.stop()


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its vLLM server
    main()
