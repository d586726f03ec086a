"""Socratic Self-Refine (SSR): find the least confident step by re-solving, fix it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.types import Attempt, Task
from refinery.strategies import socratic
from refinery.strategies.base import LoopStrategy, Scored, StructuredParams
from refinery.strategies.cot import CoT
from refinery.strategies.spec import ChildCost

Assessed = Scored[socratic.Assessment]


class SSR(LoopStrategy):
    """``ssr(inner, max_iter=3)``: Socratic self-refine, as in the reference code.

    Seed trajectory from the inner strategy. Each round: decompose it into
    sub-question/answer pairs (temperature 0, JSON); re-solve every
    sub-question ``resolves`` times at ``temperature`` (all steps at once, one
    request with n per step); confidence of a step = share of re-solves
    equivalent to its answer. The least confident step is corrected to its
    majority re-solve through a first-person reflection and a re-evaluation
    chat; the new trajectory is the text after ``</evaluation>``. An empty
    decomposition or full confidence everywhere falls back to plain
    self-refine. ``max_iter=3`` gives 3+1 refinements then a scoring-only
    round; the last trajectory is returned (the reference never stops early;
    ``early_exit`` -- stop after two fully confident rounds -- is our
    deviation, off by default). ``max_steps`` caps the sub-questions (ours:
    it bounds the cost).

    ``structured`` (refinery's addition; default: when the backend enforces JSON
    schemas and regexes) constrains every parsed step: the decomposition to
    the JSON the prompt shows, the re-solves to brief reasoning then
    ``<answer>...</answer>``, the agreement check to ``k: same|different``
    lines and the 0-5 judge to a paragraph then ``Score: N`` (shapes in
    :mod:`refinery.strategies.socratic`). ``structured=False`` is the free-text
    method as before.

    Example:
        >>> attempt = await SSR(CoT()).solve(task, ctx)  # doctest: +SKIP
        >>> [s["confidence"] for s in attempt.metadata["steps"]]  # doctest: +SKIP
        [1.0, 1.0, 0.8]
    """

    name = "ssr"
    keep = "last"
    adaptive: ClassVar[bool] = False
    min_inner = max_inner = 1
    default_inner = (CoT,)
    structured_kinds = frozenset({"json", "regex"})

    class Params(StructuredParams):
        max_iter: int = Field(3, ge=0, le=10, description="refinements = max_iter + 1")
        resolves: int = Field(5, ge=1, le=16, description="re-solves per sub-question")
        temperature: float = Field(0.6, ge=0.0, le=2.0, description="re-solve temperature")
        max_steps: int = Field(8, ge=1, le=32, description="sub-questions kept (ours)")
        early_exit: bool = Field(False, description="stop after two fully confident rounds")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return socratic.worst_case(params, children[0].calls, adaptive=False)

    def rounds(self) -> int:
        return self.params.max_iter + 2

    async def seed(self, task: Task, ctx: Context) -> Attempt:
        return await self.inner[0].solve(task, ctx.inner())

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Assessed]) -> list[Attempt]:
        if rnd == 0:
            return [await self.seed(task, ctx)]
        return [await socratic.refine(task, ctx, last[0], self.name, self.structured(ctx))]

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Assessed]:
        return [await socratic.assess(task, ctx, cands[0], self.params, adaptive=self.adaptive,
                                      strategy=self.name, structured=self.structured(ctx))]

    def stop(self, rnd: int, last: list[Assessed], pool: list[Assessed]) -> str | None:
        if (self.params.early_exit and len(pool) >= 2
                and all(s.detail is not None and s.detail.fully_confident
                        for s in pool[-2:])):
            return "fully confident twice in a row (early exit)"
        return None
