"""DeepConf against self-consistency at the same N, and what top-k logprobs cost.

One in-process engine. Per dataset (arith, GSM8K test; ``--limit`` problems each),
three runs over all its problems at once (``engine.run``, the loop detector on
with policy ``truncate``, so every sample is one call; ``--max-tokens`` per trace):

1. **sc**: ``sc(cot, n=N)``: the full-budget majority vote;
2. **deepconf**: ``deepconf(cot, n=N, <--deepconf settings>)`` online: warm-up,
   early stops (the engine aborts a stopped request), consensus;
3. **pool**: N more traces per problem, drawn with top-k logprobs and only
   measured (the ``N`` samples deepconf could have drawn). On them: (a) their own
   full-budget majority, independent of sc's: how often two full votes of
   independent samples agree is the floor any agreement with sc's vote has to be
   read against; (b) DeepConf replayed on these same traces (its j-th trace is
   the pool's j-th, cut where the monitor stops it; the strategy's own vote
   functions): its agreement with the pool's vote on identical samples, where
   sampling noise cannot blur it, and its tokens against the pool's.

Agreement: the answer is a top answer of the full-budget vote. On a tie every
tied answer counts, since each is what some tie-break returns: a weak model's
8 samples often hold 8 different answers, and then "the majority" is only the
tie-break. Also given on the *decided* problems alone (one top answer, held by
two samples or more).

Reported per dataset: tokens generated, wall time, accuracy with 95% Wilson
intervals, deepconf's agreement with sc's vote (independent samples), the
replay's agreement and token ratio (same samples), the sc-pool floor, and the
confidence's calibration on the pool (lowest group of right against wrong traces,
AUROC; ``--load`` prints it for saved pools).
Targets: >= 50% fewer tokens than sc at the same N with >= 95% agreement.

Then the cost of streaming top-k logprobs: ``--requests`` greedy GSM8K prompts,
each generated three ways on the same engine, in alternating rounds (best of
each kept): no monitor (vLLM's final output only), the loop monitor (streamed,
no logprobs), and the loop monitor plus a measuring confidence rule (streamed
with top-k logprobs). Greedy, and a rule that only measures, so all three
generate the same tokens.

    nice -n 10 python bench/deepconf.py --limit 24 --n 8 --max-tokens 256
    python bench/deepconf.py --pool-only --save pool.json   # draw the pool only
    python bench/deepconf.py --load pool.json --grid        # replay settings on it
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from refinery.engine.confidence import ConfidenceRule, percentile, token_confidence  # noqa: E402
from refinery.engine.types import Attempt, Message, SamplingParams, TokenLogprob  # noqa: E402
from refinery.strategies.deepconf import DeepConf, elect, share, tally, voter  # noqa: E402
from refinery.verifiers.math import extract_answer, normalize_answer  # noqa: E402

DATASETS = ("arith", "gsm8k")


@dataclass
class PoolTrace:
    """One pool sample: its answer, tokens, and each token's confidence and text."""

    answer: str | None
    confs: list[float]
    pieces: list[str]


@dataclass
class MethodRun:
    """One method on one dataset."""

    name: str
    answers: list[str] = field(default_factory=list)  # normalised, "" for none
    votes: list[Counter] = field(default_factory=list)  # sc: its vote per problem
    passed: list[bool] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    notes: str = ""


# ------------------------------------------------------------------------------- runs


def load(dataset: str, limit: int) -> list:
    from refinery.eval.datasets import load_arith, load_gsm8k

    return load_arith(limit=limit) if dataset == "arith" else load_gsm8k(limit=limit)


def key(answer: str | None) -> str:
    return normalize_answer(answer) if answer else ""


async def run_spec(name: str, spec: str, examples: list, backend, params) -> MethodRun:
    """``spec`` on every example at once: tokens, wall time, answers, verdicts."""
    from refinery.engine.loops import CusumLoopDetector
    from refinery.engine.run import run
    from refinery.eval.metrics import Scorer
    from refinery.strategies import build

    tasks = [ex.to_task() for ex in examples]
    t0 = time.perf_counter()
    traces = await run(build(spec), tasks, backend, concurrency=len(tasks), params=params,
                       loop_detector=CusumLoopDetector(), loop_policy="truncate",
                       on_error="raise")
    out = MethodRun(name, seconds=time.perf_counter() - t0)
    scorer = Scorer()
    for ex, trace in zip(examples, traces, strict=True):
        a = trace.attempt
        out.answers.append(key(a.answer if a else None))
        out.votes.append(Counter(a.metadata.get("votes") or {}) if a else Counter())
        out.passed.append((await scorer.score(ex, a.text if a else "", a.answer if a else None))
                          .passed)
        out.tokens += trace.usage.completion_tokens
    out.notes = notes_of(traces)
    return out


def notes_of(traces: list) -> str:
    """deepconf's traces drawn and stopped, and why sampling ended (empty for sc)."""
    metas = [t.attempt.metadata for t in traces if t.attempt and "ended" in t.attempt.metadata]
    if not metas:
        return ""
    drawn = sum(m["traces"] for m in metas)
    stopped = sum(m["stopped_traces"] for m in metas)
    ended = Counter(m["ended"] for m in metas)
    return f"traces {drawn} ({stopped} stopped early), ended {dict(ended)}"


async def draw_pool(examples: list, backend, params, n: int, k: int) -> list[list[PoolTrace]]:
    """``n`` traces per example with top-``k`` logprobs, as cot prompts them."""
    from refinery.engine.context import Context
    from refinery.engine.loops import CusumLoopDetector
    from refinery.strategies.cot import CoT

    wire = params.but(logprobs=True, top_logprobs=k)

    async def one(ex) -> list[PoolTrace]:
        ctx = Context(backend, loop_detector=CusumLoopDetector(), loop_policy="truncate")
        gen = await ctx.generate(CoT().messages(ex.to_task()), wire, n=n)
        return [PoolTrace(extract_answer(c.text), [token_confidence(t, k) for t in
                          c.token_logprobs or []], [t.token for t in c.token_logprobs or []])
                for c in gen]

    return list(await asyncio.gather(*(one(ex) for ex in examples)))


# ----------------------------------------------------------------------------- replay


@dataclass(frozen=True)
class Replayed:
    answer: str  # normalised, "" for none
    tokens: int
    drawn: int


def replay_trace(t: PoolTrace, p: DeepConf.Params, threshold: float | None) -> Attempt:
    """A pool trace as the backend would have returned it under ``threshold``."""
    mon = ConfidenceRule(top_k=p.top_k, window=p.window, threshold=threshold).start()
    used = len(t.confs)
    for j, c in enumerate(t.confs):  # a token of confidence c: logprob -c, no alternatives
        if mon.feed("", [TokenLogprob(token="", logprob=-c)]) is not None:
            used = j + 1
            break
    text = "".join(t.pieces[:used])
    answer = t.answer if used == len(t.confs) else extract_answer(text)
    return Attempt(text=text, answer=answer, metadata={"measures": mon.measures() or {},
                                                      "tokens": used})


def replay(traces: Sequence[PoolTrace], p: DeepConf.Params) -> Replayed:
    """deepconf(mode=p.mode) on pre-drawn traces, in order: the strategy's rules."""
    first = p.n if p.mode == "offline" else min(p.warmup, p.n)
    warm = [replay_trace(t, p, None) for t in traces[:first]]
    confs = [c for a in warm if (c := a.metadata["measures"].get("confidence")) is not None]
    threshold = percentile(confs, 100 - p.eta) if confs else None
    pool = [voter(a, threshold if p.mode == "offline" else None) for a in warm]
    while p.mode == "online" and share(tally(pool)) < p.consensus and len(pool) < p.n:
        batch = traces[len(pool):len(pool) + min(p.batch, p.n - len(pool))]
        pool += [voter(replay_trace(t, p, threshold), threshold) for t in batch]
    return Replayed(elect(pool).chosen.key, sum(v.attempt.metadata["tokens"] for v in pool),
                    len(pool))


def tally_of(answers: Sequence[str | None]) -> Counter:
    """The plain vote of a full budget: normalised answers counted (none: no vote)."""
    return Counter(k for a in answers if (k := key(a)))


def majority(answers: Sequence[str | None]) -> str:
    """The plain majority of normalised answers (ties: first seen), "" with none."""
    votes = tally_of(answers)
    top = max(votes.values(), default=0)
    return next((key(a) for a in answers if top and votes[key(a)] == top), "")


def agrees(answer: str, votes: Counter) -> bool:
    """``answer`` is a top answer of the full vote ``votes`` (any of them on a tie: each
    is what some tie-break would return); with no vote at all, no answer agrees."""
    return bool(votes) and votes[answer] == max(votes.values())


def decided(votes: Counter) -> bool:
    """A full vote with one top answer, held by at least two samples."""
    top = sorted(votes.values(), reverse=True)
    return bool(top) and top[0] >= 2 and (len(top) == 1 or top[1] < top[0])


# ---------------------------------------------------------------------------- reports


def acc(passed: Sequence[bool]) -> str:
    from refinery.eval.metrics import accuracy

    return str(accuracy(passed))


def agreement(answers: Sequence[str], votes: Sequence[Counter]) -> str:
    """How often ``answers`` agree with the full votes: all problems, and those decided."""
    from refinery.eval.metrics import accuracy

    pairs = list(zip(answers, votes, strict=True))
    dec = [agrees(a, v) for a, v in pairs if decided(v)]
    return (f"{accuracy([agrees(a, v) for a, v in pairs])}; on the {len(dec)} decided: "
            f"{accuracy(dec)}")


def report(dataset: str, sc: MethodRun, dc: MethodRun, pool: list[list[PoolTrace]] | None,
           p: DeepConf.Params) -> None:
    print(f"\n== {dataset}: {len(sc.answers)} problems, N={p.n}")
    for r in (sc, dc):
        print(f"{r.name:9s} tokens {r.tokens:7d}  wall {r.seconds:6.1f}s  "
              f"accuracy {acc(r.passed)}  {r.notes}")
    print(f"deepconf / sc: tokens {dc.tokens / max(1, sc.tokens):.2f} "
          f"({1 - dc.tokens / max(1, sc.tokens):+.0%} saved), wall {dc.seconds / sc.seconds:.2f}")
    print(f"agreement, deepconf's answer a top answer of sc's vote (independent samples): "
          f"{agreement(dc.answers, sc.votes)}")
    if pool is None:
        return
    full = [tally_of([t.answer for t in traces]) for traces in pool]
    reps = [replay(traces, p) for traces in pool]
    pool_tokens = sum(len(t.confs) for traces in pool for t in traces)
    print(f"floor, the pool's majority a top answer of sc's vote (two independent full "
          f"votes): {agreement([majority([t.answer for t in ts]) for ts in pool], sc.votes)}")
    print(f"replay on the pool (same samples), agreement with its full vote: "
          f"{agreement([r.answer for r in reps], full)}; tokens "
          f"{sum(r.tokens for r in reps) / max(1, pool_tokens):.2f} of the pool's, "
          f"traces drawn {sum(r.drawn for r in reps)} of {p.n * len(pool)}")
    calibration(dataset, pool, p)


def calibration(dataset: str, pool: list[list[PoolTrace]], p: DeepConf.Params) -> None:
    """Does the confidence separate right from wrong traces? Each pool trace's lowest
    group confidence (``p.window``) against its verdict: means and AUROC (0.5: chance)."""
    from refinery.verifiers.math import is_equivalent

    right, wrong = [], []
    for ex, traces in zip(load(dataset, len(pool)), pool, strict=True):
        for t in traces:
            conf = replay_trace(t, p, None).metadata["measures"].get("confidence")
            if conf is not None:
                ok = t.answer is not None and is_equivalent(t.answer, ex.gold)
                (right if ok else wrong).append(conf)
    if not right or not wrong:
        print(f"calibration: {len(right)} right, {len(wrong)} wrong traces; no AUROC")
        return
    # AUROC = P(a right trace is more confident than a wrong one), ties half.
    wins = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong)
    print(f"calibration: {len(right)} right, {len(wrong)} wrong traces; mean lowest-group "
          f"confidence {sum(right) / len(right):.2f} right, {sum(wrong) / len(wrong):.2f} "
          f"wrong; AUROC {wins / (len(right) * len(wrong)):.3f}")


def grid(pools: dict[str, list[list[PoolTrace]]], n: int) -> None:
    """Replay online settings on saved pools (how the defaults were chosen), beside sc
    on the pools' first k traces: agreement with the full vote (all; decided) and tokens."""
    for dataset, traces in pools.items():
        full = [tally_of([t.answer for t in ts]) for ts in traces]
        total = sum(len(t.confs) for ts in traces for t in ts)
        print(f"== {dataset}: {len(traces)} problems, {sum(map(decided, full))} decided")
        for k in range(1, n + 1):
            answers = [majority([t.answer for t in ts[:k]]) for ts in traces]
            used = sum(len(t.confs) for ts in traces for t in ts[:k])
            print(f"sc on {k} traces: {agreement(answers, full)}; tokens {used / total:.2f}")
        for w, eta, win in itertools.product((2, 3, 4), (10.0, 50.0, 90.0), (16, 32, 64)):
            p = DeepConf.Params(n=n, warmup=w, eta=eta, window=win)
            reps = [replay(ts, p) for ts in traces]
            print(f"deepconf warmup={w} eta={eta:.0f} window={win}: "
                  f"{agreement([r.answer for r in reps], full)}; "
                  f"tokens {sum(r.tokens for r in reps) / total:.2f}")


# ----------------------------------------------------------------------- logprob cost


async def logprob_cost(backend, requests: int, max_tokens: int, k: int, rounds: int) -> None:
    from refinery.engine.loops import CusumLoopDetector
    from refinery.engine.stops import AnyRule

    rows = load("gsm8k", requests)
    msgs = [[Message(role="user", content=ex.prompt)] for ex in rows]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    modes = {"plain": None, "loop": CusumLoopDetector(),
             "top-k": AnyRule((CusumLoopDetector(), ConfidenceRule(top_k=k)))}
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(rounds):
        for mode, stop_rule in modes.items():
            t0 = time.perf_counter()
            res = await asyncio.gather(*(backend.generate(m, params, stop_rule=stop_rule)
                                         for m in msgs))
            took = time.perf_counter() - t0
            best[mode] = min(best.get(mode, took), took)
            tokens[mode] = sum(r[0].completion_tokens for r in res)
    print(f"\n== streaming top-{k} logprobs: {requests} greedy requests, "
          f"max_tokens {max_tokens}, best of {rounds} alternating rounds")
    for mode in modes:
        print(f"{mode:6s} {tokens[mode]:6d} tokens in {best[mode]:6.2f}s "
              f"= {tokens[mode] / best[mode]:6.1f} tok/s")
    rate = {m: tokens[m] / best[m] for m in modes}
    print(f"top-k vs loop monitor: {rate['top-k'] / rate['loop'] - 1:+.1%} tok/s; "
          f"vs no monitor: {rate['top-k'] / rate['plain'] - 1:+.1%} tok/s")


# ------------------------------------------------------------------------------- main


def settings(a: argparse.Namespace) -> DeepConf.Params:
    extra = json.loads(a.deepconf) if a.deepconf else {}
    return DeepConf.Params(n=a.n, **extra)


def spec_of(p: DeepConf.Params) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in p.model_dump().items() if k != "temperature")
    return f"deepconf(cot, {fields})"


def cli(a: argparse.Namespace) -> None:
    from refinery.engine.hardware import CpuInfo

    cpu = CpuInfo.read()
    print(f"CPU: {cpu.model or '?'} ({cpu.machine}, {os.cpu_count()} cores visible)")
    if a.load:
        pools = {d: [[PoolTrace(**t) for t in ts] for ts in v]
                 for d, v in json.loads(Path(a.load).read_text()).items()}
        for dataset, pool in pools.items():
            print(f"== {dataset}")
            calibration(dataset, pool, settings(a))
        if a.grid:
            grid(pools, a.n)
        return
    pools = asyncio.run(main(a, settings(a)))
    if a.save:
        Path(a.save).write_text(json.dumps({d: [[asdict(t) for t in ts] for ts in v]
                                            for d, v in pools.items() if v}))


async def main(a: argparse.Namespace, p: DeepConf.Params) -> dict[str, list]:
    from refinery.engine.backends.vllm import VLLMBackend
    from refinery.engine.models import DEFAULT_MODEL

    backend = await VLLMBackend.create(DEFAULT_MODEL)
    print(f"engine: {DEFAULT_MODEL}, {backend.dtype.dtype if backend.dtype else '?'}; "
          f"deepconf: {spec_of(p)}; max_tokens {a.max_tokens}, temperature {a.temperature}")
    try:
        return await run_all(a, backend, p)
    finally:
        await backend.aclose()


async def run_all(a: argparse.Namespace, backend, p: DeepConf.Params) -> dict[str, list]:
    params = SamplingParams(temperature=a.temperature, max_tokens=a.max_tokens)
    pools: dict[str, list] = {}
    for dataset in a.datasets:
        examples = load(dataset, a.limit)
        if a.pool_only:
            pools[dataset] = await draw_pool(examples, backend, params, a.n, p.top_k)
            continue
        sc = await run_spec("sc", f"sc(cot, n={a.n})", examples, backend, params)
        dc = await run_spec("deepconf", spec_of(p), examples, backend, params)
        pool = (await draw_pool(examples, backend, params, a.n, p.top_k)
                if a.replay else None)
        pools[dataset] = pool
        report(dataset, sc, dc, pool, p)
    if a.requests and not a.pool_only:
        await logprob_cost(backend, a.requests, a.max_tokens, p.top_k, a.rounds)
    return pools


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=200, help="problems per dataset")
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--n", type=int, default=8, help="N: sc's samples, deepconf's budget")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--deepconf", default="", help='deepconf settings as JSON, e.g. '
                    '\'{"warmup": 3, "eta": 90}\' (default: the strategy\'s defaults)')
    ap.add_argument("--no-replay", dest="replay", action="store_false",
                    help="skip the pool (the replay and the agreement floor)")
    ap.add_argument("--requests", type=int, default=64, help="logprob cost: requests (0: skip)")
    ap.add_argument("--rounds", type=int, default=2, help="logprob cost: alternating rounds")
    ap.add_argument("--pool-only", action="store_true", help="draw the pools, nothing else")
    ap.add_argument("--save", help="write the pools to this JSON file")
    ap.add_argument("--load", help="replay saved pools instead of running the engine")
    ap.add_argument("--grid", action="store_true", help="with --load: a grid of settings")
    cli(ap.parse_args())
