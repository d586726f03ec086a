"""Run many tasks through one strategy concurrently: the batching lever.

Each task gets its own Context; all tasks' model calls are in flight at once
(up to ``concurrency`` tasks), so vLLM's continuous batching sees full batches
instead of the one-request-at-a-time pattern of sequential proxies.

A ``final_constraint`` (a JSON schema, a regex...) shapes the answer without
shaping the strategy's steps: the strategy solves as usual (its internal
steps keep their own constraints, its generations are not streamed as the
answer), then one more call, traced and budgeted like any other, turns its
solution into the required shape (``conform``). The attempt's text is that
call's output; the strategy's text is kept in ``metadata["reasoning"]``.

Example:
    >>> results = await run(strategy, tasks, backend, concurrency=64)  # doctest: +SKIP
    >>> results[0].attempt.answer  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

from refinery.engine.backends.base import Backend
from refinery.engine.constraints import Constraint
from refinery.engine.context import Budget, Context, DeltaSink, LoopPolicy
from refinery.engine.errors import BudgetExhausted, RefineryError
from refinery.engine.stops import StopRule
from refinery.engine.trace import Trace, TraceEvent, TraceWriter
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task, Usage

T = TypeVar("T")
OnError = Literal["record", "raise"]


class Solver(Protocol):
    """What ``run`` needs of a strategy."""

    name: str

    async def solve(self, task: Task, ctx: Context) -> Attempt: ...


EXHAUSTED = "budget exhausted before any answer"
ChoiceListener = Callable[[int, TraceEvent], None]
ChoiceSink = Callable[[int], DeltaSink]


async def solve_one(strategy: Solver, task: Task, backend: Backend, *,
                    budget: Budget | None = None, params: SamplingParams | None = None,
                    loop_detector: StopRule | None = None, loop_policy: LoopPolicy = "retry",
                    verifier: Any = None, listener: Any = None, final_sink: Any = None,
                    spec: str = "", gold: str | None = None,
                    final_constraint: Constraint | None = None) -> Trace:
    """Solve one task; the returned Trace holds the task, the attempt, usage and every event.

    ``gold`` (when the caller knows it) is written into the trace's task
    record only; the strategy never sees it. Strategy errors are raised; a
    spent budget with no attempt at all is recorded as the trace's error.
    ``final_constraint`` shapes the answer (see the module docstring).
    """
    traces = await solve_choices(
        strategy, task, backend, budget=budget, params=params, loop_detector=loop_detector,
        loop_policy=loop_policy, verifier=verifier, spec=spec, gold=gold,
        final_constraint=final_constraint,
        listener=(lambda _, ev: listener(ev)) if listener else None,
        final_sink=(lambda _: final_sink) if final_sink else None)
    return traces[0]


async def solve_choices(strategy: Solver, task: Task, backend: Backend, *, n: int = 1,
                        budget: Budget | None = None, params: SamplingParams | None = None,
                        loop_detector: StopRule | None = None,
                        loop_policy: LoopPolicy = "retry", verifier: Any = None,
                        listener: ChoiceListener | None = None,
                        final_sink: ChoiceSink | None = None, spec: str = "",
                        trace_ids: Sequence[str] | None = None, gold: str | None = None,
                        on_exhausted: OnError = "record",
                        final_constraint: Constraint | None = None) -> list[Trace]:
    """Solve ``task`` ``n`` times independently and concurrently on one shared budget.

    The one run path: ``solve_one`` is ``n=1`` and the server's ``n`` choices
    are this. ``listener`` and ``final_sink`` get the choice index. A spent
    budget with no attempt is recorded as the trace's error, or re-raised with
    ``on_exhausted="raise"``; the first other failure cancels the siblings.
    Every trace's ``usage`` is the shared total.

    With ``final_constraint`` each choice ends with ``conform``'s call (greedy,
    the constraint, ``params``' logprobs); the strategy's own calls then do not
    ask for logprobs. ``params.constraint``, by contrast, applies to every call.

    Example:
        >>> budget = Budget(max_calls=4)
        >>> a, b = await solve_choices(CoT(), task, backend, n=2, budget=budget)  # doctest: +SKIP
    """
    params, final_params = split_params(params or SamplingParams(), final_constraint)
    root = Context(backend, task=task, budget=budget, params=params, verifier=verifier,
                   loop_detector=loop_detector, loop_policy=loop_policy)
    ids = trace_ids or [task.id if n == 1 else f"{task.id}/{i}" for i in range(n)]

    async def choice(i: int) -> Trace:
        trace = Trace(task_id=ids[i], task=task.record(gold), strategy=spec or strategy.name,
                      model=backend.model)
        ctx = root.fork(trace=trace,
                        listener=(lambda ev: listener(i, ev)) if listener else None,
                        final_sink=final_sink(i) if final_sink else None)
        t0 = time.monotonic()
        try:
            trace.attempt = await solve_shaped(strategy, task, ctx, final_params)
        except BudgetExhausted as exc:
            if on_exhausted == "raise":
                raise
            trace.fail(exc, f"{EXHAUSTED}: {exc}")
        finally:
            trace.seconds = time.monotonic() - t0
        return trace

    traces = await gather_or_cancel([choice(i) for i in range(n)])
    for trace in traces:
        trace.usage = root.spent
    return traces


def split_params(params: SamplingParams, final_constraint: Constraint | None,
                 ) -> tuple[SamplingParams, SamplingParams | None]:
    """The strategy's params and, with a final constraint, the shaping call's.

    The shaping call is greedy, one sample, constrained, with ``params``'
    logprobs; the strategy's calls then ask for no logprobs of their own.
    """
    if final_constraint is None:
        return params, None
    return (params.but(logprobs=False, top_logprobs=0),
            params.but(temperature=0.0, n=1, constraint=final_constraint))


async def solve_shaped(strategy: Solver, task: Task, ctx: Context,
                       final: SamplingParams | None) -> Attempt:
    """The strategy's attempt; with ``final`` params, shaped by :func:`conform`."""
    if final is None:
        return await strategy.solve(task, ctx)
    solution = await strategy.solve(task, ctx.inner())  # steps: reasoning, not the answer
    return await conform(task, solution, ctx, final)


def format_instruction(constraint: Constraint) -> str:
    """The turn that asks for the solution above in ``constraint``'s shape.

    The constraint enforces the syntax; the instruction tells the model what
    the shape means (a schema's fields, the allowed choices), which it cannot
    guess from the syntax alone.
    """
    if constraint.json_schema is not None:
        shape = ("as one JSON object valid under this JSON schema:\n"
                 + json.dumps(constraint.json_schema, ensure_ascii=False))
    elif constraint.json_object:
        shape = "as one JSON object"
    elif constraint.regex is not None:
        shape = f"as text matching the regular expression {constraint.regex}"
    elif constraint.choice is not None:
        shape = "as exactly one of: " + ", ".join(constraint.choice)
    else:
        shape = "in the required format"
    return (f"Now give the final answer to the original request, from your solution "
            f"above, {shape}. Reply with that only.")


async def conform(task: Task, solution: Attempt, ctx: Context,
                  params: SamplingParams) -> Attempt:
    """One more call: ``solution`` rewritten in the shape ``params.constraint`` requires.

    The conversation, the solution as the assistant's turn and
    :func:`format_instruction` go to the model with ``params`` (greedy, the
    constraint). The call is the user-visible answer (``final=True``: a live
    sink streams it). The attempt keeps the strategy's answer and score; its
    text is the constrained output and ``metadata["reasoning"]`` the solution.
    """
    assert params.constraint is not None
    messages = [*task.messages, Message(role="assistant", content=solution.text),
                Message(role="user", content=format_instruction(params.constraint))]
    gen = await ctx.generate(messages, params, step="final", strategy="format",
                             parents=solution.events, final=True)
    out = gen[0]
    return solution.model_copy(update={
        "text": out.text, "finish_reason": out.finish_reason, "events": [gen.event_id],
        "metadata": {**solution.metadata, "reasoning": solution.text}})


def answer_completion(trace: Trace) -> Completion | None:
    """The sample whose text is the trace's answer, if one can be identified.

    Searched in the attempt's own events first, then in every generation,
    newest first. A strategy whose answer is not one sample's text (a
    composed or edited text) has none. Its ``token_logprobs`` are the answer's
    logprobs when the call asked for them.
    """
    if trace.attempt is None:
        return None
    own = set(trace.attempt.events)
    generations = [e for e in reversed(trace.events) if e.kind == "generation"]
    generations.sort(key=lambda e: e.id not in own)  # stable: own events first
    for event in generations:
        for comp in event.completions or []:
            if comp.text == trace.attempt.text:
                return comp
    return None


def reasoning_tokens(traces: Sequence[Trace], usage: Usage) -> int:
    """The generated tokens of a run that are not its returned answers' (OpenAI's
    ``completion_tokens_details.reasoning_tokens``).

    ``usage`` is the run's shared total over its choices (``traces``). A
    choice's answer tokens are those of the sample that became its answer
    (:func:`answer_completion`: a passthrough's one generation, the final
    format call, a strategy's chosen sample); every other generated token
    (drafts, votes, critiques, judges, retried loops) is reasoning. A choice
    whose answer is not one sample's text (composed, or a section cut out of
    a reply) has no answer tokens of its own: all its tokens count as
    reasoning. Always between 0 and ``usage.completion_tokens``.

    Example:
        >>> traces = await solve_choices(build("sc(cot, n=4)"), task, backend)  # doctest: +SKIP
        >>> reasoning_tokens(traces, traces[0].usage)  # doctest: +SKIP
        96
    """
    answers = sum(comp.completion_tokens for trace in traces
                  if (comp := answer_completion(trace)) is not None)
    return max(0, usage.completion_tokens - answers)


async def gather_or_cancel(coros: Sequence[Awaitable[T]]) -> list[T]:
    """Like gather, but the first failure cancels the siblings (no orphan work)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def solve_recorded(strategy: Solver, task: Task, backend: Backend, *,
                         gold: str | None = None, **kwargs: Any) -> Trace:
    """:func:`solve_one`, with a refinery error recorded on the Trace instead of raised.

    The unit of work of :func:`iter_run` and of a Ray actor (``refinery.eval.ray_pool``):
    the caller decides what a recorded error means by ``trace.exception``'s type.
    """
    try:
        return await solve_one(strategy, task, backend, gold=gold, **kwargs)
    except RefineryError as exc:
        trace = Trace(task_id=task.id, task=task.record(gold),
                      strategy=kwargs.get("spec") or strategy.name, model=backend.model)
        trace.fail(exc)
        return trace


async def iter_run(strategy: Solver, tasks: Sequence[Task], backend: Backend, *,
                   concurrency: int = 64, trace_writer: TraceWriter | None = None,
                   on_error: OnError = "record", golds: Mapping[str, str | None] | None = None,
                   stop: asyncio.Event | None = None, **kwargs: Any) -> AsyncIterator[Trace]:
    """Yield each task's Trace as it finishes (completion order).

    ``golds`` maps task ids to gold answers, recorded in the traces (see :func:`solve_one`).

    ``on_error="record"`` turns a failed task into a Trace with ``error`` set
    (the run goes on; ``trace.exception`` is the error); ``"raise"`` propagates
    the first failure.

    Once ``stop`` is set, no further task starts: the ones in flight finish and
    are yielded, the others are not (a drain, for a run that will be resumed).
    """
    sem = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Trace | None:
        async with sem:
            if stop is not None and stop.is_set():
                return None
            gold = golds.get(task.id) if golds else None
            if on_error == "raise":
                trace = await solve_one(strategy, task, backend, gold=gold, **kwargs)
            else:
                trace = await solve_recorded(strategy, task, backend, gold=gold, **kwargs)
            if trace_writer is not None:
                await trace_writer.write(trace)
            return trace

    pending = [asyncio.ensure_future(one(t)) for t in tasks]
    try:
        for fut in asyncio.as_completed(pending):
            trace = await fut
            if trace is not None:
                yield trace
    finally:
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def run(strategy: Solver, tasks: Sequence[Task], backend: Backend, *,
              concurrency: int = 64, progress: Callable[[Trace], None] | None = None,
              **kwargs: Any) -> list[Trace]:
    """Solve every task; return Traces in the order of ``tasks``."""
    by_id: dict[str, Trace] = {}
    async for trace in iter_run(strategy, tasks, backend, concurrency=concurrency, **kwargs):
        by_id[trace.task_id] = trace
        if progress is not None:
            progress(trace)
    return [by_id[t.id] for t in tasks]
