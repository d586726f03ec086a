"""Procedural memory at inference: lessons of earlier problems in the prompt."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import Strategy, StrategyParams, with_note
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.memory_store import load_store
from refinery.strategies.spec import ChildCost

NOTE = "Lessons from similar problems:\n{lessons}"


class Memory(Strategy):
    """``memory(inner, store=DIR, k=3)``: the inner strategy, with the ``k`` lessons and
    patterns of a procedural-memory store most relevant to the question in its prompt.

    Steps: the store (``refinery distill loop --pmd`` writes one per round, under
    ``round-R/memory``) is read once and again only when its files change;
    :meth:`~refinery.strategies.memory_store.MemoryStore.retrieve` ranks its
    lessons and patterns against the question by BM25; the best ``k`` are added
    after the question as a bulleted note, and the inner strategy solves that
    task. With nothing relevant in the store the task goes through unchanged.
    The trace records what was retrieved (a ``memory`` step), and the task
    recorded for the trace stays the question as asked, so rows distilled from
    a ``memory(...)`` run teach the answer without the scaffold (PMD's
    memory-conditioned self-teacher).

    Source: procedural memory distillation (PMD): lessons and patterns kept
    across episodes condition a self-teacher whose solutions are distilled
    into a student that sees no memory.

    Example:
        >>> memory = Memory(CoT(), store="runs/pmd/round-1/memory")
        >>> attempt = await memory.solve(task, ctx)  # doctest: +SKIP
    """

    name = "memory"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        store: str = Field(..., description="memory store directory (lessons.jsonl, ...)")
        k: int = Field(3, ge=1, le=16, description="lessons and patterns retrieved")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return children[0].calls

    def recall(self, task: Task, ctx: Context) -> Task:
        """The task with the relevant lessons added to its question (recorded in the trace)."""
        found = load_store(self.params.store).retrieve(task.question, self.params.k)
        ctx.emit("memory", "\n".join(found), strategy=self.name, lessons=len(found))
        if not found:
            return task
        return with_note(task, NOTE.format(lessons="\n".join(f"- {x}" for x in found)))

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        return await self.inner[0].solve(self.recall(task, ctx), ctx.inner())

    async def sample(self, task: Task, ctx: Context, n: int, *,
                     temperature: float | None = None, logprobs: bool = False) -> list[Attempt]:
        """``n`` attempts of the inner strategy on the recalled task (one request for cot, pot)."""
        return await sample_inner(self.inner[0], self.recall(task, ctx), ctx, n,
                                  temperature=temperature, logprobs=logprobs)
