"""Mixture of agents: several drafts, one critique of them all, one synthesis."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    PartialAttempts,
    Strategy,
    StrategyParams,
    attempt_from,
    exc_message,
    with_question,
)
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.cot_reflection import CoTReflection
from refinery.strategies.re2 import ReRead
from refinery.strategies.spec import ChildCost
from refinery.verifiers.math import normalize_answer

# Inner strategies whose n drafts are one request (cot and its variants).
ONE_REQUEST = frozenset(c.name for c in (CoT, ReRead, CoTReflection))
MAX_DRAFT = 2000  # characters of each draft shown to the critic and the synthesis (the tail)

CRITIQUE = """Several drafts answer the problem below. Review them as a careful examiner.

Problem:
{question}

{drafts}

For each draft, say briefly what it gets right and where it goes wrong (a misread \
quantity, an arithmetic slip, a missing step). Then say which final answer is best \
supported and why. Do not write a new solution."""

SYNTHESIS = """Below are {n} drafts of a solution and a review of them.

{drafts}

Review:
{critique}

Write one complete solution step by step: keep the drafts' correct steps and avoid the \
mistakes the review points out. Then write the final answer as \\boxed{{...}}."""


def show(drafts: Sequence[Attempt]) -> str:
    """The drafts, numbered, each clipped to its last MAX_DRAFT characters."""
    def clip(text: str) -> str:
        return text if len(text) <= MAX_DRAFT else "..." + text[-MAX_DRAFT:]
    return "\n\n".join(f"Draft {i}:\n{clip(d.text.strip())}" for i, d in enumerate(drafts, 1))


class MoA(Strategy):
    """``moa(inner, n=3)``: n drafts, a critique of all of them, then one synthesis.

    Steps: (1) draw ``n`` drafts from the inner strategy (a cot inner, or a cot
    variant such as ``re2``, samples all of them in ONE request at
    ``temperature``; any other inner runs n times concurrently); (2) one
    critique request shows the problem and every draft and asks, per draft,
    what is right and what is wrong, and which answer is best supported;
    (3) one synthesis request gives the conversation the drafts and the
    critique and asks for a single complete solution, boxed. The synthesis is
    the answer (at the root it streams to the client) and its answer is
    extracted as cot's. Critique and synthesis run at ``review_temperature``.

    If the budget runs out after some drafts but before the synthesis, the
    draft with the most common answer is returned (first seen on ties), with
    ``budget_exhausted`` in its metadata; with no draft the error is raised.

    Source: Wang et al. 2024, "Mixture-of-Agents Enhances Large Language Model
    Capabilities"; OptiLLM's ``moa`` approach (one model as every agent:
    three drafts, a critique, a final answer).

    Example:
        >>> attempt = await MoA(CoT(), n=3).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["draft_answers"], attempt.answer  # doctest: +SKIP
        (['18', '20', '18'], '18')
    """

    name = "moa"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        n: int = Field(3, ge=1, le=8, description="drafts")
        temperature: float = Field(1.0, ge=0.0, le=2.0,
                                   description="draft temperature (cot, re2, cot_reflection inner)")
        review_temperature: float = Field(0.1, ge=0.0, le=2.0,
                                          description="critique and synthesis temperature")
        critique_tokens: int = Field(512, ge=32, le=2048, description="critique length cap")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        drafts = 1 if inner.name in ONE_REQUEST else params.n * inner.calls
        return drafts + 2  # the critique and the synthesis

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        try:
            drafts = await self.draft(task, ctx)
        except PartialAttempts as exc:
            if not exc.attempts:
                raise
            return self.fallback(ctx, exc.attempts, exc)
        try:
            critique = await self.critique(task, ctx, drafts)
            return await self.synthesize(task, ctx, drafts, critique)
        except BudgetExhausted as exc:
            return self.fallback(ctx, drafts, exc)

    async def draft(self, task: Task, ctx: Context) -> list[Attempt]:
        return await sample_inner(self.inner[0], task, ctx, self.params.n,
                                  temperature=self.params.temperature)

    async def critique(self, task: Task, ctx: Context, drafts: list[Attempt]) -> tuple[str, str]:
        """The critique's text and the id of its trace event."""
        prompt = CRITIQUE.format(question=task.question, drafts=show(drafts))
        params = ctx.params.but(temperature=self.params.review_temperature,
                                max_tokens=min(ctx.params.max_tokens, self.params.critique_tokens))
        gen = await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                 step="critique", strategy=self.name,
                                 parents=[e for d in drafts for e in d.events])
        return gen[0].text.strip(), gen.event_id

    async def synthesize(self, task: Task, ctx: Context, drafts: list[Attempt],
                         critique: tuple[str, str]) -> Attempt:
        text, critique_id = critique
        note = SYNTHESIS.format(n=len(drafts), drafts=show(drafts), critique=text)
        params = ctx.params.but(temperature=self.params.review_temperature)
        gen = await ctx.generate(with_question(task.messages, note), params, n=1,
                                 step="refine", strategy=self.name, final=True,
                                 parents=[*(e for d in drafts for e in d.events), critique_id])
        return attempt_from(gen[0], strategy=self.name, events=[gen.event_id],
                            drafts=len(drafts), draft_answers=[d.answer for d in drafts])

    def fallback(self, ctx: Context, drafts: list[Attempt], spent: BudgetExhausted) -> Attempt:
        """The draft with the most common answer, when the budget ends the run early."""
        keys = [normalize_answer(d.answer) if d.answer else "" for d in drafts]
        counts = Counter(k for k in keys if k)
        best = max(counts, key=counts.get) if counts else ""  # first seen wins ties
        chosen = drafts[keys.index(best)] if best else drafts[0]
        eid = ctx.emit("select", chosen.answer or "", strategy=self.name,
                       parents=chosen.events, stopped="budget", candidates=len(drafts))
        meta = {**chosen.metadata, "drafts": len(drafts),
                "draft_answers": [d.answer for d in drafts],
                "stopped": "budget", "budget_exhausted": exc_message(spent)}
        return chosen.model_copy(update={"strategy": self.name, "events": [eid],
                                         "metadata": meta})
