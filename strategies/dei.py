"""DEI committee: several member strategies answer; reviewers score each candidate."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Detail,
    LoopStrategy,
    PartialScores,
    Scored,
    StructuredParams,
    gather_attempts,
    record_parse,
    step_params,
)
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.sage import SAGE
from refinery.strategies.spec import ChildCost
from refinery.strategies.ssr import SSR
from refinery.verifiers.judge import grade_pattern, parse_score
from refinery.verifiers.math import normalize_answer

REVIEW = """You are on a review committee judging one candidate solution.

Problem:
{question}

Candidate solution:
{solution}

Write five short paragraphs, in this order:
1. The task: explain what the problem asks for.
2. The context: explain the facts and quantities it gives.
3. Where the candidate acts: explain which parts of the problem each of its steps uses.
4. How it solves the task: explain the candidate's approach.
5. Conflicts and errors: point out every mistake, contradiction or unjustified step.
Then grade the candidate from 1 to 10. A wrong core step or a wrong final answer caps the \
grade at 3; style problems cost at most one point. End with a line "Score: N"."""
NEUTRAL = 5.5  # mean grade of a candidate with no readable review (ours)
# Structured mode: the five paragraphs REVIEW asks for, numbered, one bounded line each
# (no line break inside, so the next number always follows), then the grade line.
PARAGRAPH_CHARS = 240
REVIEW_FORM = Constraint.from_regex(
    "".join(rf"{k}\. [^\n]{{1,{PARAGRAPH_CHARS}}}\n" for k in range(1, 6))
    + f"Score: {grade_pattern(1, 10)}")


class Review(Detail):
    """The committee's mean grade of every candidate, and which member this one is."""

    means: list[float]
    member: int


class DEI(LoopStrategy):
    """``dei(member, member, ..., votes=10)``: a committee picks among its members' answers.

    The members (any strategies; diversity helps) run concurrently, each on
    ``ctx.inner()``. Each candidate gets ``votes`` independent reviews in ONE
    request (n=votes): the reviewer explains the task, the context, where the
    candidate acts and how it solves the task, flags conflicts, then grades
    1-10; unreadable grades are dropped (all unreadable -> neutral 5.5). The
    highest mean grade wins. A tie at the top gets one more vote round for the
    tied candidates; if they are still tied, the answer most members gave
    wins, then the member listed first.

    ``structured`` (refinery's addition; default: when the backend enforces
    regexes) constrains each review to :data:`REVIEW_FORM`: the five
    paragraphs, numbered, one line of at most ``PARAGRAPH_CHARS`` characters
    each, then ``Score: 1..10``. The rationale stays free within its lines;
    the grade is always there and the review is bounded (~1,250 characters),
    still one request per candidate. ``structured=False`` is the free-text
    review. Each review request's trace event notes which samples held a grade.

    Example:
        >>> from refinery.strategies.cot import CoT
        >>> dei = DEI(SSR(), CritiqueRefine(), SAGE(CoT()), votes=5)
        >>> attempt = await dei.solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["means"]  # doctest: +SKIP
        [7.4, 6.0, 7.8]
    """

    name = "dei"
    min_inner, max_inner = 1, None
    default_inner = (SSR, CritiqueRefine, SAGE)
    structured_kinds = frozenset({"regex"})

    class Params(StructuredParams):
        votes: int = Field(10, ge=1, le=32, description="reviews per candidate (one request)")
        temperature: float = Field(0.7, ge=0.0, le=2.0, description="reviewer temperature")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        # one review request per candidate, plus one tie round per candidate
        return sum(c.calls for c in children) + 2 * len(children)

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[Review]]) -> list[Attempt]:
        return await gather_attempts(m.solve(task, ctx.inner()) for m in self.inner)

    async def review(self, task: Task, ctx: Context, attempt: Attempt) -> tuple[list[float], str]:
        """``votes`` grades of one candidate from one request, and its trace event."""
        prompt = REVIEW.format(question=task.question, solution=attempt.text)
        structured = self.structured(ctx)
        params = step_params(ctx, REVIEW_FORM if structured else None,
                             temperature=self.params.temperature)
        gen = await ctx.generate([Message(role="user", content=prompt)], params,
                                 n=self.params.votes, step="review", strategy=self.name,
                                 parents=attempt.events)
        # The five numbered paragraphs make a bare "last number" unreliable: only an
        # explicit grade (labelled, JSON, bold or N/10) counts.
        reads = [parse_score(c.text, 1, 10) for c in gen]
        explicit = [r.value is not None and r.how != "last-number" for r in reads]
        record_parse(ctx, gen.event_id, "review", explicit, structured=structured)
        return [r.value for r, ok in zip(reads, explicit, strict=True) if ok], gen.event_id

    async def vote_round(self, task: Task, ctx: Context, cands: list[Attempt],
                         which: list[int], grades: list[list[float]],
                         events: list[list[str]]) -> BudgetExhausted | None:
        """Review the candidates ``which``, adding to ``grades`` and ``events``."""
        results = await asyncio.gather(*(self.review(task, ctx, cands[i]) for i in which),
                                       return_exceptions=True)
        spent = None
        for i, r in zip(which, results, strict=True):
            if isinstance(r, BudgetExhausted):
                spent = spent or r
            elif isinstance(r, BaseException):
                raise r
            else:
                grades[i].extend(r[0])
                events[i].append(r[1])
        return spent

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[Review]]:
        grades: list[list[float]] = [[] for _ in cands]
        events: list[list[str]] = [[] for _ in cands]
        spent = await self.vote_round(task, ctx, cands, list(range(len(cands))), grades, events)
        means = [sum(g) / len(g) if g else NEUTRAL for g in grades]
        top = max(means)
        tied = [i for i, m in enumerate(means) if abs(m - top) < 1e-9]
        if len(tied) > 1 and spent is None:
            spent = await self.vote_round(task, ctx, cands, tied, grades, events)
            means = [sum(g) / len(g) if g else NEUTRAL for g in grades]
            vid = ctx.emit("vote", "tie round", strategy=self.name,
                           parents=[e for i in tied for e in events[i]],
                           tied=tied, means=[means[i] for i in tied])
            for i in tied:
                events[i].append(vid)
        keys = [normalize_answer(a.answer) if a.answer else "" for a in cands]
        counts = Counter(k for k in keys if k)
        scored = []
        for i, attempt in enumerate(cands):
            eid = ctx.emit("review", f"mean grade {means[i]:.2f}", strategy=self.name,
                           parents=[*attempt.events, *events[i]], grades=grades[i])
            scored.append(Scored(attempt, means[i] / 10, (counts.get(keys[i], 0),), [eid],
                                 Review(means=means, member=i)))
        if spent is not None:
            reviewed = [s if events[i] else Scored(s.attempt) for i, s in enumerate(scored)]
            raise PartialScores(spent, reviewed)
        return scored
