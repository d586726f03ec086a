"""Best-of-n: n samples scored by the task's verifier, an LLM judge or a step scorer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted, RefineryError
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Detail,
    LoopStrategy,
    PartialScores,
    SampledParams,
    Scored,
    StructuredParams,
    record_parse,
    step_params,
)
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.spec import ChildCost
from refinery.verifiers.judge import parse_score, score_form
from refinery.verifiers.math import normalize_answer
from refinery.verifiers.steps import (
    MAX_STEPS,
    Aggregation,
    ScorerName,
    aggregate,
    build_scorer,
    split_steps,
)

JUDGE = """You are grading a solution to a problem.

Problem:
{question}

Solution:
{solution}

Check the reasoning step by step and say whether the final answer follows. Then grade the \
solution from 1 (wrong) to 10 (certainly correct and complete). Finish with a line \
"Score: N"."""

NEUTRAL = 5.5  # an unreadable grade sits in the middle of 1..10 (our choice)
# Structured mode: one paragraph checking the solution, then the grade line.
JUDGE_FORM = Constraint.from_regex(score_form(1, 10))


class Grade(Detail):
    """How a candidate was scored: by the task's verifier, or by the judge's 1-10 grade."""

    scorer: Literal["verifier", "judge", "steps"]
    grade: float | None = None
    step_scores: list[float] | None = None  # a step scorer's, one per step
    fallback: str | None = None  # why the grade is the neutral one
    verifier_error: str | None = None  # why the verifier could not score it


class BestOfN(LoopStrategy):
    """``best_of_n(inner, n=8, scorer='auto')``: sample n, score each, keep the best.

    Scoring uses the task's label-free verifier (``ctx.verifier``, e.g. code
    tests shipped with the prompt) when there is one and ``scorer`` allows it,
    else an LLM judge: one request per candidate at temperature 0, grading
    1-10. Ties go to the candidate sampled first. A plain ``cot`` inner
    samples all n in one request.

    ``structured`` (refinery's addition; default: when the backend enforces
    regexes) constrains the judge's reply to one paragraph of checking, then
    ``Score: 1..10`` (:func:`~refinery.verifiers.judge.score_form`), so the
    grade is always readable; ``structured=False`` is the free-text judge.
    Each judge call's trace event notes whether its grade parsed.

    ``step_scorer`` (``arith``, ``judge``, ``prm``: :mod:`refinery.verifiers.steps`)
    scores each candidate's steps, its paragraphs, as a process reward model
    would, folded by ``aggregate``; ``weighted=True`` then picks the answer whose
    candidates' scores sum highest, and its best candidate (weighted best-of-n,
    as in search-and-learn), instead of the single best candidate.

    Example:
        >>> attempt = await BestOfN(CoT(), n=4, scorer="judge").solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["scorer"], attempt.score  # doctest: +SKIP
        ('judge', 0.9)
    """

    name = "best_of_n"
    tool_turns = True  # votes or scores its samples, calls included
    min_inner = max_inner = 1
    default_inner = (CoT,)

    structured_kinds = frozenset({"regex"})

    class Params(StructuredParams, SampledParams):
        scorer: Literal["auto", "verifier", "judge"] = Field(
            "auto", description="auto: the verifier when the task has one, else the judge")
        step_scorer: ScorerName | None = Field(None, description="arith | judge | prm: "
                                               "score the steps")
        aggregate: Aggregation = Field("last", description="step scores -> candidate score")
        weighted: bool = Field(False, description="sum the scores of candidates per answer")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        sampling = inner.calls if inner.one_request else params.n * inner.calls
        if params.step_scorer is not None:  # a judge of steps: one call per step
            return sampling + (params.n * MAX_STEPS if params.step_scorer == "judge" else 0)
        return sampling + params.n  # the judge, when there is no verifier

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[Grade]]) -> list[Attempt]:
        return await sample_inner(self.inner[0], task, ctx, self.params.n,
                                  temperature=self.params.temperature)

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[Grade]]:
        if self.params.step_scorer is not None:
            return await self.score_steps(task, ctx, cands)
        use_verifier = ctx.verifier is not None and self.params.scorer != "judge"
        scorer = self.verify if use_verifier else self.judge
        results = await asyncio.gather(*(scorer(task, ctx, a) for a in cands),
                                       return_exceptions=True)
        scored = []
        for attempt, r in zip(cands, results, strict=True):
            if isinstance(r, BaseException) and not isinstance(r, BudgetExhausted):
                raise r
            scored.append(Scored(attempt) if isinstance(r, BaseException) else r)
        spent = next((r for r in results if isinstance(r, BudgetExhausted)), None)
        if spent is not None:
            raise PartialScores(spent, scored)
        return scored

    async def score_steps(self, task: Task, ctx: Context,
                          cands: list[Attempt]) -> list[Scored[Grade]]:
        """Every candidate's steps scored at once by the step scorer (a fresh one per
        solve: a judge keeps what it scored of this solve only)."""
        scorer = build_scorer(self.params.step_scorer)
        steps = await scorer.score(task, [split_steps(a.text) for a in cands], ctx)
        scored = []
        for attempt, step_scores in zip(cands, steps, strict=True):
            value = aggregate(step_scores, self.params.aggregate)
            eid = ctx.emit("judge", f"{scorer.name}: {value:.3f}", strategy=self.name,
                           parents=attempt.events, scorer=scorer.name, steps=step_scores,
                           score=value)
            scored.append(Scored(attempt, value, events=[eid], detail=Grade(
                scorer="steps", step_scores=list(step_scores))))
        return scored

    def select(self, pool: list[Scored[Grade]]) -> Scored[Grade]:
        """The best candidate; with ``weighted``, the best of the answer whose candidates
        sum the highest score (candidates without an answer do not weigh)."""
        if not self.params.weighted:
            return super().select(pool)
        totals: dict[str, float] = {}
        for s in pool:
            if s.attempt.answer:
                key = normalize_answer(s.attempt.answer)
                totals[key] = totals.get(key, 0.0) + (s.score or 0.0)
        if not totals:
            return super().select(pool)
        top = max(totals, key=totals.__getitem__)  # first seen on a tie
        return super().select([s for s in pool if s.attempt.answer
                               and normalize_answer(s.attempt.answer) == top])

    async def verify(self, task: Task, ctx: Context, attempt: Attempt) -> Scored[Grade]:
        try:
            verdict = await ctx.verifier.verify(task, attempt.text)
        except RefineryError as exc:  # a verifier that cannot run here: judge instead
            judged = await self.judge(task, ctx, attempt)
            return replace(judged, detail=judged.detail.model_copy(
                update={"verifier_error": str(exc)}))
        eid = ctx.emit("judge", f"passed={verdict.passed}", strategy=self.name,
                       parents=attempt.events, verifier=getattr(ctx.verifier, "name", ""),
                       passed=verdict.passed, score=verdict.score)
        return Scored(attempt, verdict.score, events=[eid], detail=Grade(scorer="verifier"))

    async def judge(self, task: Task, ctx: Context, attempt: Attempt) -> Scored[Grade]:
        prompt = JUDGE.format(question=task.question, solution=attempt.text)
        structured = self.structured(ctx)
        params = step_params(ctx, JUDGE_FORM if structured else None, temperature=0.0,
                             max_tokens=min(ctx.params.max_tokens, 384))
        gen = await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                 step="judge", strategy=self.name, parents=attempt.events)
        grade = parse_score(gen[0].text, 1, 10).value
        record_parse(ctx, gen.event_id, "judge", [grade is not None], structured=structured)
        detail = Grade(scorer="judge", grade=NEUTRAL if grade is None else grade,
                       fallback="unreadable grade -> neutral" if grade is None else None)
        return Scored(attempt, detail.grade / 10, events=[gen.event_id], detail=detail)

