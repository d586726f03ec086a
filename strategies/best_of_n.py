"""Best-of-n: n samples scored by the task's verifier or an LLM judge; keep the best."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted, RefineryError
from refinery.engine.graph import ChildCost
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
from refinery.verifiers.judge import parse_score, score_form

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

    scorer: Literal["verifier", "judge"]
    grade: float | None = None
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

    Example:
        >>> attempt = await BestOfN(CoT(), n=4, scorer="judge").solve(task, ctx)
        >>> attempt.metadata["scorer"], attempt.score
        ('judge', 0.9)
    """

    name = "best_of_n"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    structured_kinds = frozenset({"regex"})

    class Params(StructuredParams, SampledParams):
        scorer: Literal["auto", "verifier", "judge"] = Field(
            "auto", description="auto: the verifier when the task has one, else the judge")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        sampling = inner.calls if inner.one_request else params.n * inner.calls
        return sampling + params.n  # the judge, when there is no verifier

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[Grade]]) -> list[Attempt]:
        return await sample_inner(self.inner[0], task, ctx, self.params.n,
                                  temperature=self.params.temperature)

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[Grade]]:
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

