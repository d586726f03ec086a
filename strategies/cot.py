"""Chain of thought: one generation, answer extracted. The floor every strategy is
compared with, and the default inner strategy of the others."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.trace import StepKind
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Sampler,
    Strategy,
    StrategyParams,
    attempt_from,
    gather_attempts,
    with_question,
)

INSTRUCTION = ("Work through the problem step by step, then write the final answer as "
               "\\boxed{...}.")


class CoT(Strategy):
    """One step-by-step sample of the task.

    At the root its generation is the user-visible answer, so it is marked
    ``final`` (the server streams it). ``sample`` gives n samples in ONE
    request (vLLM's parallel sampling), which self-consistency and best-of-n
    use instead of n separate solves.

    Example:
        >>> attempt = await CoT(temperature=0.0).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.answer  # doctest: +SKIP
        '18'
    """

    name = "cot"
    tool_turns = True  # its answer is its one sample, a call or text
    samples_in_one_request = True  # sample_inner sends n attempts as one request

    class Params(StrategyParams):
        temperature: float | None = Field(None, ge=0.0, le=2.0,
                                          description="None: the context's default")
        instruction: str = Field(INSTRUCTION, description="appended to the question; '' = none")

    def messages(self, task: Task) -> list[Message]:
        if not self.params.instruction:
            return list(task.messages)
        return with_question(task.messages, self.params.instruction)

    async def sample(self, task: Task, ctx: Context, n: int, *,
                     temperature: float | None = None, logprobs: bool = False,
                     final: bool = False, step: StepKind = "draft",
                     parents: Sequence[str] = ()) -> list[Attempt]:
        """``n`` attempts from one request."""
        temp = temperature if temperature is not None else self.params.temperature
        params = ctx.params.but(logprobs=logprobs or ctx.params.logprobs,
                                **({} if temp is None else {"temperature": temp}))
        gen = await ctx.generate(self.messages(task), params, n=n, step=step,
                                 strategy=self.name, parents=parents, final=final)
        return [attempt_from(c, strategy=self.name, events=[gen.event_id]) for c in gen]

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        # final=True is safe: parents hand inner strategies ctx.inner(), which
        # has no final sink, unless this run's text really is the answer.
        [attempt] = await self.sample(task, ctx, 1, final=True)
        return attempt


async def sample_inner(inner: Strategy, task: Task, ctx: Context, n: int, *,
                       temperature: float | None = None,
                       logprobs: bool = False) -> list[Attempt]:
    """``n`` attempts of ``inner`` at ``temperature`` (None: the context's): one request
    with n samples for a :class:`Sampler` (vLLM's parallel sampling), else n concurrent
    solves, each on an inner view sampling at that temperature (so ``sc(pot)`` in a
    greedy run still draws n different programs)."""
    if isinstance(inner, Sampler):
        return await inner.sample(task, ctx.inner(), n, temperature=temperature,
                                  logprobs=logprobs)
    view = ctx.inner()
    if temperature is not None:
        view = view.fork(params=ctx.params.but(temperature=temperature))
    return await gather_attempts(inner.solve(task, view) for _ in range(n))
