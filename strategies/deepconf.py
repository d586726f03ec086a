"""DeepConf: voting over the most confident traces, stopping unconfident ones early."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from refinery.engine.confidence import ConfidenceRule, percentile
from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted, SpecError
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import SampledParams, Strategy, dedupe, exc_message
from refinery.strategies.confidence_vote import Ended, Voter, elect, share, tally, voter
from refinery.strategies.cot import CoT
from refinery.strategies.spec import ChildCost


class DeepConf(Strategy):
    """``deepconf(cot, n=8, mode=online)``: confidence-filtered, confidence-weighted voting.

    A trace's confidence is its lowest group confidence (engine/confidence.py:
    minus the mean top-``top_k`` log-probability per token, averaged over a
    sliding ``window``), measured by the backend as the trace streams.
    Offline: ``n`` traces; the top ``eta`` % by confidence (at or above the
    ``100 - eta`` percentile) vote, each with its confidence as weight.
    Online: ``warmup`` traces set the threshold at that percentile of their
    confidences and all vote; then traces come in concurrent batches of
    ``batch``, each stopped by the backend (request aborted, finish
    ``confidence``) as soon as a window's mean falls below the threshold,
    until the leading answer holds ``consensus`` of the weighted vote or ``n``
    traces were drawn. Later traces vote if not stopped and at or above the
    threshold (one shorter than a window is judged whole). No answer, no vote.
    The answer's text is its most confident voter; ``score`` its share.
    The inner strategy is a cot variant (cot, re2, cot_reflection).

    Source: Fu, Wang, Tian and Zhao, "Deep Think with Confidence" (2025);
    OptiLLM's ``deepconf``.

    Example:
        >>> attempt = await DeepConf(CoT(), n=8, window=64).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["threshold"], attempt.metadata["traces"]  # doctest: +SKIP
        (9.84, 5)
    """

    name = "deepconf"
    tool_turns = True  # votes or scores its samples, calls included
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(SampledParams):
        """DeepConf-low (eta 10, OptiLLM's default variant). warmup, window: chosen on
        SmolLM2-135M, 8 traces of <= 256 tokens on 24 arith + 24 GSM8K problems,
        replaying settings on the same traces (``bench/deepconf.py --grid``): the
        most tokens saved; windows of 16 to 64 measured alike there. The paper's
        2048-token window is for traces of 10k+ tokens."""

        mode: Literal["online", "offline"] = Field("online", description="online: warm-up, "
                                                   "early stops and consensus; offline: n traces")
        eta: float = Field(10.0, gt=0.0, le=100.0, description="percent of traces kept: 10 "
                           "DeepConf-low, 90 DeepConf-high")
        warmup: int = Field(2, ge=1, le=64, description="online: traces setting the threshold")
        window: int = Field(32, ge=1, description="tokens per confidence group")
        consensus: float = Field(0.95, gt=0.0, le=1.0, description="online: stop once the "
                                 "leading answer holds this share of the weighted vote")
        top_k: int = Field(20, ge=1, le=20, description="candidates per token confidence")
        batch: int = Field(2, ge=1, le=64, description="online: traces drawn at once later")

    def __init__(self, *inner: Strategy, **params: Any) -> None:
        super().__init__(*inner, **params)
        cot_inside(self.inner)

    @classmethod
    def from_validated(cls, inner: Sequence[Strategy], params: Any) -> DeepConf:
        return super().from_validated(cot_inside(inner), params)

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        later = math.ceil(max(0, params.n - params.warmup) / params.batch)
        return 1 if params.mode == "offline" else 1 + later

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        p = self.params
        first = p.n if p.mode == "offline" else min(p.warmup, p.n)
        warm = await self.sample(task, ctx, first, None)
        confs = [c for a in warm if (c := voter(a, None).confidence) is not None]
        threshold = percentile(confs, 100 - p.eta) if confs else None
        said = "none (no logprobs)" if threshold is None else f"{threshold:.3f}"
        ctx.emit("threshold", f"stop below {said}", strategy=self.name,
                 parents=dedupe(e for a in warm for e in a.events), threshold=threshold,
                 percentile=100 - p.eta, confidences=confs)
        if p.mode == "offline":
            return self.decide(ctx, [voter(a, threshold) for a in warm], threshold,
                               Ended("offline"))
        # Online, the warm-up's traces all vote: they set the scale, and filtering them
        # by their own percentile would leave one voter (an instant consensus) at eta 10.
        pool, ended = await self.extend(task, ctx, [voter(a, None) for a in warm], threshold)
        return self.decide(ctx, pool, threshold, ended)

    async def sample(self, task: Task, ctx: Context, k: int,
                     threshold: float | None) -> list[Attempt]:
        """``k`` traces in one call, each watched by the confidence rule."""
        p = self.params
        rule = ConfidenceRule(top_k=p.top_k, window=p.window, threshold=threshold)
        inner: CoT = self.inner[0]  # type: ignore[assignment]
        return await inner.sample(task, ctx.inner().fork(stop_rule=rule), k,
                                  temperature=p.temperature)

    async def extend(self, task: Task, ctx: Context, pool: list[Voter],
                     threshold: float | None) -> tuple[list[Voter], Ended]:
        """Online: batches of traces until consensus, ``n`` traces or the budget."""
        p = self.params
        while share(tally(pool)) < p.consensus:
            if len(pool) >= p.n:
                return pool, Ended("n")
            try:
                more = await self.sample(task, ctx, min(p.batch, p.n - len(pool)), threshold)
            except BudgetExhausted as exc:
                return pool, Ended("budget", exc_message(exc))
            pool = pool + [voter(a, threshold) for a in more]
            votes, stopped = tally(pool), sum(v.stopped_at is not None for v in pool)
            ctx.emit("vote", ", ".join(f"{k}: {w:.1f}" for k, w in votes.items())
                     + f"; share {share(votes):.2f}; {stopped} of {len(pool)} stopped",
                     strategy=self.name, parents=dedupe(e for a in more for e in a.events),
                     votes=votes, share=share(votes), records=[v.record() for v in pool])
        return pool, Ended("consensus")

    def decide(self, ctx: Context, pool: list[Voter], threshold: float | None,
               ended: Ended) -> Attempt:
        won = elect(pool)
        meta = {"votes": won.votes, "threshold": threshold, "traces": len(pool),
                "stopped_traces": sum(v.stopped_at is not None for v in pool),
                "voters": won.voters, "ended": ended.reason, "mode": self.params.mode}
        if ended.budget is not None:
            meta["budget_exhausted"] = ended.budget
        eid = ctx.emit("select", won.chosen.attempt.answer or "", strategy=self.name,
                       parents=dedupe(won.chosen.attempt.events), share=share(won.votes),
                       records=[v.record() for v in pool], **meta)
        return won.chosen.attempt.model_copy(update={
            "strategy": self.name, "score": share(won.votes), "events": [eid], "metadata": meta})


def cot_inside(inner: Sequence[Strategy]) -> Sequence[Strategy]:
    """``inner``, if it is one cot variant (a trace must be one generation).

    Raises:
        SpecError: another strategy inside.
    """
    if not isinstance(inner[0], CoT):
        raise SpecError(f"deepconf needs a cot variant inside (cot, re2, cot_reflection), "
                        f"got {inner[0].name}: a trace must be a single generation")
    return inner
