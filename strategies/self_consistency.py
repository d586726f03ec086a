"""Self-consistency: n samples, majority vote over normalised answers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, TypeVar

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import Detail, LoopStrategy, SampledParams, Scored, Strategy
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.spec import ChildCost
from refinery.verifiers.math import normalize_answer


def mean_logprob(attempt: Attempt) -> float | None:
    """Per-token log-probability of one sample, if the backend reported it."""
    lp, tokens = attempt.metadata.get("logprob"), attempt.metadata.get("tokens")
    if lp is None or not tokens:
        return None
    return lp / tokens


def answer_groups(cands: Sequence[Attempt]) -> tuple[list[str], dict[str, list[int]]]:
    """Each candidate's vote key (its normalised answer; ``""``: no answer, no vote) and
    the indices voting for each key, keys in first-seen order."""
    keys = [normalize_answer(a.answer) if a.answer else "" for a in cands]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        if key:
            groups.setdefault(key, []).append(i)
    return keys, groups


V = TypeVar("V", bound="Seedable")


class Seedable(Strategy):
    """A vote that counts attempts of its inner strategy drawn before it (a cascade's
    earlier stages) as its first samples, and draws only the rest.

    ``seeded(prior)`` is a copy for one solve: the strategy object itself stays
    shared and unseeded.

    Example:
        >>> SelfConsistency(CoT(), n=4).seeded([Attempt(text="4", answer="4")]).prior[0].answer
        '4'
    """

    prior: tuple[Attempt, ...] = ()

    def seeded(self: V, prior: Sequence[Attempt]) -> V:
        copy = type(self).from_validated(self.inner, self.params)
        copy.prior = tuple(prior)
        return copy


class Votes(Detail):
    """Votes per normalised answer (samples without an answer do not vote)."""

    votes: dict[str, int]


class SelfConsistency(Seedable, LoopStrategy):
    """``sc(inner, n=8)``: sample n solutions, return the majority answer.

    With a plain ``cot`` inner the n samples are ONE backend request (vLLM
    parallel sampling, shared prompt prefix) at ``temperature``; any other
    inner runs n times concurrently. Answers are grouped by
    ``normalize_answer``; samples without an answer do not vote. Ties go to
    the group seen first (as OptiLLM, DSPy and lm-evaluation-harness break
    them); ``tie_break="logprob"`` sends them to the group with the higher
    mean per-token log-probability first. That asks the engine for every
    sample's log-probabilities, which cost 1.09x (AVX2 paths) to 1.2x (native
    bf16) the wall time of the same samples behind a vLLM server on a 2-core
    CPU (32 GSM8K questions x 5 samples, alternated), and at 135M the
    log-probability ranks right answers no better than chance (docs/results.md,
    DeepConf). The returned text is the first sample of the winning group;
    ``score`` is the winning share of all samples. Seeded with prior attempts
    (:class:`Seedable`), those vote first and n minus them are drawn.

    Example:
        >>> sc = SelfConsistency(CoT(), n=8)
        >>> attempt = await sc.solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["votes"]  # doctest: +SKIP
        {'18': 6, '20': 2}
    """

    name = "sc"
    tool_turns = True  # votes or scores its samples, calls included
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(SampledParams):
        """``n`` samples of the inner strategy, drawn at ``temperature``."""

        tie_break: Literal["first", "logprob"] = Field(
            "first", description="who wins a tie: the group seen first, or the higher mean "
                                 "per-token log-probability (asks the engine for logprobs)")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        return inner.calls if inner.one_request else params.n * inner.calls

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[Votes]]) -> list[Attempt]:
        prior = list(self.prior[:self.params.n])
        if len(prior) == self.params.n:
            return prior
        return prior + await sample_inner(self.inner[0], task, ctx, self.params.n - len(prior),
                                          temperature=self.params.temperature,
                                          logprobs=self.params.tie_break == "logprob")

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[Votes]]:
        keys, groups = answer_groups(cands)
        voters = sum(len(g) for g in groups.values())
        votes = {k: len(g) for k, g in groups.items()}
        tally = Votes(votes=votes)
        eid = ctx.emit("vote", max(votes, key=votes.get) if votes else "", strategy=self.name,
                       parents=[e for a in cands for e in a.events], votes=votes,
                       abstained=len(cands) - voters)
        scored = []
        for i, (attempt, key) in enumerate(zip(cands, keys, strict=True)):
            if not key:
                scored.append(Scored(attempt, 0.0, (-math.inf, -i), [eid], tally))
                continue
            members = groups[key]
            mean_lp = self._tie_rank(cands, members)
            scored.append(Scored(attempt, len(members) / len(cands),
                                 (mean_lp, -members[0]), [eid], tally))
        return scored

    def _tie_rank(self, cands: list[Attempt], members: list[int]) -> float:
        """What breaks a tie before first-seen: the group's mean per-token log-prob."""
        if self.params.tie_break == "first":
            return 0.0
        lps = [lp for j in members if (lp := mean_logprob(cands[j])) is not None]
        return sum(lps) / len(lps) if lps else -math.inf
