"""Adaptive self-consistency: samples until a Beta posterior says the majority holds."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted, RefineryError
from refinery.engine.stops import AbortSwitch, AnyRule
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import (
    PartialAttempts,
    StrategyParams,
    dedupe,
    exc_message,
)
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.self_consistency import Seedable, answer_groups
from refinery.strategies.spec import ChildCost

Against = Literal["rest", "runner_up"]


def leader_holds(leader: int, other: int) -> float:
    """P(p_leader > p_other) for votes ``leader`` and ``other`` under a uniform prior:
    p_leader / (p_leader + p_other) ~ Beta(leader + 1, other + 1), and P(X > 1/2) is a
    binomial tail, sum over j <= leader of C(leader + other + 1, j) / 2^(leader+other+1).

    Example:
        >>> round(leader_holds(4, 0), 3), round(leader_holds(3, 1), 3)
        (0.969, 0.812)
    """
    n = leader + other + 1
    return sum(math.comb(n, j) for j in range(leader + 1)) / 2 ** n


def contest(counts: Sequence[int], against: Against) -> tuple[int, int]:
    """The leader's votes and those it is tested against (the runner-up, or all the rest)."""
    ranked = sorted(counts, reverse=True) or [0]
    other = sum(ranked[1:]) if against == "rest" else (ranked[1] if len(ranked) > 1 else 0)
    return ranked[0], other


def votes_needed(leader: int, other: int, confidence: float, cap: int) -> int:
    """How many more votes for the leader would make it hold (``cap``: at most)."""
    k = 0
    while k < cap and leader_holds(leader + k, other) < confidence:
        k += 1
    return k


class AdaptiveSelfConsistency(Seedable):
    """``asc(inner, max_n=16)``: self-consistency that stops once the vote is decided.

    Samples run concurrently, at most ``window`` at a time and no more than the
    leader still needs (``eager``: always ``window``); after each one ends, the
    leader (most votes, first seen on ties) is tested against the ``rest`` of the
    votes (or the ``runner_up``): it holds when P(p_leader > p_other) >=
    ``confidence`` under a uniform Beta prior (4 of 4 agreeing decides at 0.95),
    or when the runner-up could not catch up within ``max_n`` samples. Samples
    still running then end at their next token (finish ``abort``, tokens counted)
    and do not vote; no answer, no vote. The returned text is the leader's first
    sample; ``score`` its share of the samples. Seeded with prior attempts
    (:class:`~refinery.strategies.self_consistency.Seedable`), those are its first
    samples (they may decide the vote before any is drawn).

    Source: Aggarwal, Madaan, Yang and Mausam, "Let's Sample Step by Step:
    Adaptive-Consistency for Efficient Reasoning and Coding with LLMs" (2023);
    its_hub's BetaSelfConsistency.

    Example:
        >>> asc = AdaptiveSelfConsistency(CoT(), max_n=16)
        >>> attempt = await asc.solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["votes"], attempt.metadata["stopped"]  # doctest: +SKIP
        ({'18': 4}, 'confident')
    """

    name = "asc"
    tool_turns = True  # votes or scores its samples, calls included
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        """Adaptive-Consistency's Beta criterion at its 0.95 threshold."""

        max_n: int = Field(16, ge=1, le=64, description="samples at most")
        confidence: float = Field(0.95, gt=0.5, lt=1.0,
                                  description="stop once P(leader ahead) reaches this")
        against: Against = Field("rest", description="test the leader against the rest "
                                 "of the votes, or the runner-up only")
        window: int = Field(4, ge=1, le=64, description="samples running at once at most")
        eager: bool = Field(False, description="keep window samples running (less wall "
                            "time, more tokens aborted), not only as many as still needed")
        temperature: float = Field(0.7, ge=0.0, le=2.0,
                                   description="temperature the samples are drawn at")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        return params.max_n * inner.calls

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        switch = AbortSwitch()
        view = ctx.fork(stop_rule=AnyRule.of(ctx.stop_rule, switch))
        runs: set[asyncio.Task[list[Attempt]]] = set()
        pool: list[Attempt] = list(self.prior[:self.params.max_n])
        launched, spent = len(pool), None
        try:
            while (reason := self.verdict(pool)) is None:
                launched += self.launch(task, view, runs, pool, launched)
                done, runs = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
                got, spent = harvest(done)
                pool += got
                self.tally(ctx, got, pool, len(runs))
                if spent is not None:
                    reason = "budget"
                    break
        except BaseException:
            for run in runs:
                run.cancel()
            raise
        switch.fire()  # the samples still running stop at their next token
        aborted = len(runs)
        if runs:
            await asyncio.wait(runs)
        return self.decide(ctx, pool, reason, aborted, spent)

    def verdict(self, pool: list[Attempt]) -> str | None:
        """Why to stop now (``confident``, ``max_n``, ``settled``), or None to go on."""
        p = self.params
        counts = [len(g) for g in answer_groups(pool)[1].values()]
        leader, other = contest(counts, p.against)
        if leader and leader_holds(leader, other) >= p.confidence:
            return "confident"
        if len(pool) >= p.max_n:
            return "max_n"
        runner_up = contest(counts, "runner_up")[1]
        return "settled" if leader > runner_up + p.max_n - len(pool) else None

    def launch(self, task: Task, view: Context, runs: set, pool: list[Attempt],
               launched: int) -> int:
        """Start samples up to as many as the leader still needs (``eager``: up to
        ``window``), at most ``window`` running and ``max_n`` in all."""
        p = self.params
        counts = [len(g) for g in answer_groups(pool)[1].values()]
        need = votes_needed(*contest(counts, p.against), p.confidence, p.window)
        k = min((p.window if p.eager else max(1, need)) - len(runs), p.max_n - launched)
        for j in range(launched, launched + k):  # named by launch order, for harvest
            runs.add(asyncio.create_task(sample_inner(
                self.inner[0], task, view, 1, temperature=p.temperature), name=str(j)))
        return max(k, 0)

    def tally(self, ctx: Context, got: list[Attempt], pool: list[Attempt],
              running: int) -> None:
        """Trace the vote after samples ended, with the posterior the stop reads."""
        groups = answer_groups(pool)[1]
        votes = {k: len(g) for k, g in groups.items()}
        leader, other = contest(list(votes.values()), self.params.against)
        posterior = leader_holds(leader, other)
        ctx.emit("vote", max(votes, key=votes.get) if votes else "", strategy=self.name,
                 parents=dedupe(e for a in got for e in a.events), votes=votes,
                 samples=len(pool), running=running, posterior=round(posterior, 4))

    def decide(self, ctx: Context, pool: list[Attempt], reason: str, aborted: int,
               spent: BudgetExhausted | None) -> Attempt:
        if not pool:
            raise spent or RefineryError(f"{self.name} produced no candidate")
        groups = answer_groups(pool)[1]
        votes = {k: len(g) for k, g in groups.items()}
        leader = max(votes, key=votes.get) if votes else None  # first seen wins ties
        chosen = pool[groups[leader][0]] if leader is not None else pool[0]
        posterior = leader_holds(*contest(list(votes.values()), self.params.against))
        meta = {"votes": votes, "samples": len(pool), "aborted": aborted,
                "posterior": round(posterior, 4), "stopped": reason}
        if spent is not None:
            meta["budget_exhausted"] = exc_message(spent)
        score = votes[leader] / len(pool) if leader is not None else 0.0
        eid = ctx.emit("select", chosen.answer or "", strategy=self.name,
                       parents=dedupe(chosen.events), score=score, **meta)
        return chosen.model_copy(update={
            "strategy": self.name, "score": score, "events": [eid], "metadata": meta})


def harvest(done: set[asyncio.Task[list[Attempt]]]
            ) -> tuple[list[Attempt], BudgetExhausted | None]:
    """The attempts of ended samples (in launch order), and the budget error if one ran
    out.

    Raises:
        Exception: any other error of a sample, as it was raised.
    """
    got: list[Attempt] = []
    spent = None
    for run in sorted(done, key=lambda r: int(r.get_name())):
        exc = run.exception()
        if isinstance(exc, BudgetExhausted):
            spent = exc
            got += exc.attempts if isinstance(exc, PartialAttempts) else []
        elif exc is not None:
            raise exc
        else:
            got += run.result()
    return got, spent
