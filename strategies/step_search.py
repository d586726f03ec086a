"""Step-level search: the one loop beam search, DVTS and particle filtering share.

A solution grows a step at a time (a step ends at a blank line). Each level,
every live path asks the engine for its next steps (continuing its partial
assistant turn; all paths of the level at once, so they batch and share their
prefix in the cache), a :class:`~refinery.verifiers.steps.StepScorer` scores
the grown paths, and the strategy's ``select`` decides which go on. A path
ends when a step states the final answer, comes back empty or is cut. The
answer is the finished path with the best aggregated score; when no path
finished, the best partial one is completed in one more generation.

Every level is one ``search`` trace event: each path's score, and what was
kept, pruned or resampled.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task
from refinery.strategies.base import Strategy, StrategyParams, with_question
from refinery.verifiers.math import extract_answer, extract_boxed
from refinery.verifiers.steps import (
    STEP_END,
    Aggregation,
    ScorerName,
    StepScorer,
    aggregate,
    build_scorer,
)

__all__ = ["STEP_END", "SearchParams", "StepPath", "StepSearch", "ends_solution"]

INSTRUCTION = ("Solve it step by step, one short step per paragraph, each with its "
               "calculation written out. End with: The answer is \\boxed{...}.")


def ends_solution(step: str, finish: str) -> bool:
    """Whether a path ends with ``step``: it states the final answer, is empty, or was
    cut (``finish`` other than ``stop``)."""
    return (not step.strip() or finish != "stop" or extract_boxed(step) is not None
            or "answer is" in step.lower())


@dataclass(frozen=True)
class StepPath:
    """One partial solution: its steps, their scores, and where it came from."""

    steps: tuple[str, ...] = ()
    scores: tuple[float, ...] = ()
    done: bool = False
    finish: str = "stop"
    group: int = 0  # DVTS's subtree; 0 elsewhere
    events: tuple[str, ...] = ()
    index: int = 0  # which completion of its last event wrote its last step

    @property
    def text(self) -> str:
        return STEP_END.join(self.steps)

    def value(self, how: Aggregation) -> float:
        return aggregate(self.scores, how)

    def grown(self, comp: Completion, event_id: str, index: int, group: int = 0) -> StepPath:
        step = comp.text.strip("\n")
        return replace(self, steps=(*self.steps, step) if step.strip() else self.steps,
                       done=ends_solution(step, comp.finish_reason), finish=comp.finish_reason,
                       group=group, events=(*self.events, event_id), index=index)


class SearchParams(StrategyParams):
    """What every step search takes."""

    scorer: ScorerName = Field("arith", description="step scorer: arith | judge | prm")
    aggregate: Aggregation = Field("last", description="step scores -> path score")
    max_steps: int = Field(8, ge=1, le=32, description="levels before the best is completed")
    temperature: float = Field(0.8, ge=0.0, le=2.0, description="sampling of the next steps")
    step_tokens: int = Field(96, ge=8, le=1024, description="max tokens of one step")
    instruction: str = Field(INSTRUCTION, description="appended to the question")


class StepSearch(Strategy):
    """Base of the step searches; ``fanout`` and ``select`` are what differ.

    ``carries_finished``: finished paths stay in the population that ``select``
    sees (particle filtering resamples them with the rest); otherwise a finished
    path leaves the search for the answer pool at once and ``select`` ranks the
    live ones only.
    """

    Params = SearchParams
    carries_finished = False

    def first_paths(self) -> list[StepPath]:
        """The empty paths the search starts from (one request each)."""
        return [StepPath()]

    def fanout(self, level: int) -> int:
        """Next steps drawn for each live path at ``level``."""
        raise NotImplementedError

    def select(self, population: list[StepPath], rng: random.Random) -> list[int]:
        """Indices into ``population`` of the paths that go on (repeats: copies)."""
        raise NotImplementedError

    def _setup(self, task: Task, ctx: Context) -> tuple[StepScorer, list[Message],
                                                         SamplingParams]:
        """A solve's step scorer (a fresh one: a judge keeps this solve's scores only),
        prompt, and the sampling of one step."""
        p = self.params
        scorer, messages = build_scorer(p.scorer), with_question(task.messages, p.instruction)
        return scorer, messages, ctx.params.but(temperature=p.temperature,
                                                max_tokens=p.step_tokens,
                                                stop=[*ctx.params.stop, STEP_END])

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        p = self.params
        scorer, messages, params = self._setup(task, ctx)
        rng = random.Random(f"{getattr(p, 'seed', 0)}:{task.id}")
        live, finished, exhausted = self.first_paths(), [], None
        for level in range(p.max_steps):
            try:
                grown = await self._grow(task, ctx, messages, params, live, scorer, level)
            except BudgetExhausted as exc:
                exhausted = exc
                break
            if self.carries_finished:
                population, finished = finished + grown, []
            else:
                finished += [g for g in grown if g.done]
                population = [g for g in grown if not g.done]
            kept = self.select(population, rng) if population else []
            self._record(ctx, level, grown, population, kept)
            finished += [population[i] for i in kept if population[i].done]
            live = [population[i] for i in kept if not population[i].done]
            if not live:
                break
        return await self._answer(ctx, messages, finished, live, exhausted)

    def _record(self, ctx: Context, level: int, grown: list[StepPath],
                population: list[StepPath], kept: list[int], **extra: Any) -> None:
        """One ``search`` event; ``extra``: what else the strategy records (mcts's chain)."""
        how = self.params.aggregate
        values = [round(g.value(how), 4) for g in population]
        # Each step scored at this level, finished or not, as (generation event,
        # completion index, score): with the events' texts, the scored tree (distill's
        # stepwise rows read it).
        last = [[g.events[-1] if g.events else None, g.index,
                 g.scores[-1] if g.scores else None] for g in grown]
        ctx.emit("search", f"level {level}: kept {len(kept)} of {len(population)}",
                 strategy=self.name, level=level, scores=values, kept=kept,
                 pruned=[i for i in range(len(population)) if i not in kept],
                 done=[i for i, g in enumerate(population) if g.done], last_steps=last,
                 **extra)

    async def _grow(self, task: Task, ctx: Context, messages: list[Message],
                    params: SamplingParams, live: list[StepPath], scorer: StepScorer,
                    level: int) -> list[StepPath]:
        """Every live path's next steps (all requests at once), scored."""
        n = self.fanout(level)

        async def one(path: StepPath) -> list[StepPath]:
            gen = await ctx.generate(_turn(messages, path), params, n=n,
                                     step="continue" if path.steps else "draft",
                                     strategy=self.name, parents=path.events[-1:],
                                     continue_final=bool(path.steps))
            # Each first step founds its own group (DVTS's subtrees); later steps inherit it.
            return [path.grown(c, gen.event_id, i, group=i if not path.steps else path.group)
                    for i, c in enumerate(gen)]

        grown = [g for gs in await asyncio.gather(*(one(path) for path in live)) for g in gs]
        scores = await scorer.score(task, [g.steps for g in grown], ctx)
        return [replace(g, scores=tuple(s)) for g, s in zip(grown, scores, strict=True)]

    async def _answer(self, ctx: Context, messages: list[Message], finished: list[StepPath],
                      live: list[StepPath], exhausted: BudgetExhausted | None) -> Attempt:
        how = self.params.aggregate
        pool = finished or live
        if not pool:
            if exhausted is not None:
                raise exhausted
            pool = [StepPath()]
        best = max(pool, key=lambda g: g.value(how))
        text = best.text
        if not best.done and exhausted is None:
            text = await self._complete(ctx, messages, best)
        meta = {"steps": len(best.steps), "score": best.value(how),
                "finished": len(finished), **({"budget_exhausted": str(exhausted)}
                                               if exhausted is not None else {})}
        return Attempt(text=text, answer=extract_answer(text), finish_reason=best.finish,
                       score=best.value(how), strategy=self.name, events=list(best.events),
                       metadata=meta)

    async def _complete(self, ctx: Context, messages: list[Message], path: StepPath) -> str:
        """The best unfinished path written to its end in one generation."""
        try:
            gen = await ctx.generate(_turn(messages, path), ctx.params.but(temperature=0.0),
                                     step="continue", strategy=self.name,
                                     parents=path.events[-1:], continue_final=bool(path.steps))
        except BudgetExhausted:
            return path.text
        return (path.text + STEP_END if path.steps else "") + gen[0].text


def _turn(messages: list[Message], path: StepPath) -> list[Message]:
    if not path.steps:
        return messages
    return [*messages, Message(role="assistant", content=path.text + STEP_END)]

