"""Run many tasks through one strategy concurrently: the batching lever.

Each task gets its own Context; all tasks' model calls are in flight at once
(up to ``concurrency`` tasks), so vLLM's continuous batching sees full batches
instead of the one-request-at-a-time pattern of sequential proxies.

Example:
    >>> results = await run(strategy, tasks, backend, concurrency=64)
    >>> results[0].attempt.answer
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol

from refinery.engine.backends.base import Backend
from refinery.engine.context import Budget, Context, LoopPolicy
from refinery.engine.errors import BudgetExhausted, RefineryError
from refinery.engine.loops import LoopDetector
from refinery.engine.trace import Trace, TraceWriter
from refinery.engine.types import Attempt, SamplingParams, Task

OnError = Literal["record", "raise"]


class Solver(Protocol):
    """What ``run`` needs of a strategy."""

    name: str

    async def solve(self, task: Task, ctx: Context) -> Attempt: ...


async def solve_one(strategy: Solver, task: Task, backend: Backend, *,
                    budget: Budget | None = None, params: SamplingParams | None = None,
                    loop_detector: LoopDetector | None = None, loop_policy: LoopPolicy = "retry",
                    verifier: Any = None, listener: Any = None, final_sink: Any = None,
                    spec: str = "", gold: str | None = None) -> Trace:
    """Solve one task; the returned Trace holds the task, the attempt, usage and every event.

    ``gold`` (when the caller knows it) is written into the trace's task
    record only; the strategy never sees it. Strategy errors are raised; a
    spent budget with no attempt at all is recorded as the trace's error.
    """
    trace = Trace(task_id=task.id, task=task.record(gold), strategy=spec or strategy.name,
                  model=backend.model)
    ctx = Context(backend, task=task, budget=budget, trace=trace, params=params,
                  loop_detector=loop_detector, loop_policy=loop_policy, verifier=verifier,
                  listener=listener, final_sink=final_sink)
    t0 = time.monotonic()
    try:
        trace.attempt = await strategy.solve(task, ctx)
    except BudgetExhausted as exc:
        trace.fail(exc, f"budget exhausted before any answer: {exc}")
    finally:
        trace.usage = ctx.spent
        trace.seconds = time.monotonic() - t0
    return trace


async def iter_run(strategy: Solver, tasks: Sequence[Task], backend: Backend, *,
                   concurrency: int = 64, trace_writer: TraceWriter | None = None,
                   on_error: OnError = "record", golds: Mapping[str, str | None] | None = None,
                   **kwargs: Any) -> AsyncIterator[Trace]:
    """Yield each task's Trace as it finishes (completion order).

    ``golds`` maps task ids to gold answers, recorded in the traces (see :func:`solve_one`).

    ``on_error="record"`` turns a failed task into a Trace with ``error`` set
    (the run goes on; ``trace.exception`` is the error); ``"raise"`` propagates
    the first failure.
    """
    sem = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> Trace:
        async with sem:
            try:
                gold = golds.get(task.id) if golds else None
                trace = await solve_one(strategy, task, backend, gold=gold, **kwargs)
            except RefineryError as exc:
                if on_error == "raise":
                    raise
                trace = Trace(task_id=task.id, task=task.record(gold),
                              strategy=kwargs.get("spec") or strategy.name, model=backend.model)
                trace.fail(exc)
            if trace_writer is not None:
                await trace_writer.write(trace)
            return trace

    pending = [asyncio.ensure_future(one(t)) for t in tasks]
    try:
        for fut in asyncio.as_completed(pending):
            yield await fut
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
