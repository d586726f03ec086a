"""An eval's tasks on a Ray cluster: K actors, each owning one engine.

Each actor solves *whole tasks*: every call a strategy makes for one problem
shares its prompt prefix (the question, then earlier drafts), so keeping them on
one engine keeps that engine's prefix cache warm. The driver (the process that
runs ``refinery eval run --ray``) keeps what must happen once: it hands out
tasks, at most ``concurrency`` in flight per actor (back-pressure: a slow actor
is handed fewer), and it alone writes results and traces, to the same files a
local run writes.

An actor that dies (process killed, node lost, engine dead) takes no work with
it: the tasks it was solving go back in the queue for the others. Their results
never reached the driver, so nothing is written twice. When every actor is gone
the run stops like a local run whose engine died (finished problems are kept;
rerun to resume).

Ray is imported here only, and only by a run that asks for it.

Example:
    >>> opts = RayOptions(replicas=2)  # a local Ray cluster, two engines
    >>> work = Work("sc(cot, n=4)", BackendSpec(), SamplingParams(), Budget(), "retry")
    >>> async for trace in iter_ray_run(opts, work, tasks, concurrency=32):  # doctest: +SKIP
    ...     print(trace.task_id, trace.attempt.answer)
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from refinery.engine.backends.factory import BackendSpec, make_backend
from refinery.engine.context import Budget, LoopPolicy
from refinery.engine.errors import (
    BackendUnavailableError,
    EngineStartError,
    InvalidRequestError,
)
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.run import solve_recorded
from refinery.engine.trace import Trace, TraceWriter
from refinery.engine.types import SamplingParams, Task

__all__ = ["RayOptions", "Work", "iter_ray_run", "split_cpus"]

log = logging.getLogger(__name__)
_IDLE_POLL = 0.1  # seconds an idle feeder waits for work a dying actor may hand back


class RayOptions(BaseModel):
    """Where and how wide a run goes on Ray.

    ``address``: None starts a Ray instance on this machine for the run (and
    stops it after); ``"auto"`` joins the cluster this node belongs to;
    ``"ray://head:10001"`` connects a remote driver. ``num_cpus``/``num_gpus`` are
    each actor's Ray resources; on GPUs set ``num_gpus`` to ``tensor_parallel_size``.
    ``env`` is set in every actor (``HF_TOKEN``, ``VLLM_CPU_KVCACHE_SPACE``...).
    """

    address: str | None = None
    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    tensor_parallel_size: int = Field(1, ge=1)
    env: dict[str, str] = Field(default_factory=dict)
    start_timeout: float = Field(900.0, gt=0, description="seconds for every engine to start")

    def recorded(self) -> dict[str, Any]:
        """What a run's config.json keeps: the names of ``env``, never its values (tokens)."""
        return {**self.model_dump(exclude={"env"}), "env": sorted(self.env)}


@dataclass(frozen=True)
class Work:
    """What every actor needs to solve a task exactly as a local run would."""

    strategy: str  # the canonical spec
    backend: BackendSpec
    params: SamplingParams
    budget: Budget
    loop_policy: LoopPolicy


@dataclass(frozen=True)
class Placement:
    node: str
    cpus: tuple[int, ...]
    pid: int


@dataclass(frozen=True)
class Finished:
    """A solved task as it crosses the wire: the trace as JSON (the exception does not
    pickle reliably), and whether it failed because the actor's engine is gone."""

    trace_json: str
    unavailable: bool

    def trace(self) -> Trace:
        trace = Trace.model_validate_json(self.trace_json)
        if self.unavailable:
            trace.fail(BackendUnavailableError(trace.error or "engine unavailable"),
                       trace.error)
        return trace


class TaskActor:
    """The body of one Ray actor: one engine, whole tasks. ``ray.remote`` wraps it in
    :func:`iter_ray_run`, so the class itself needs no Ray to import."""

    def __init__(self, work: Work) -> None:
        self.work = work
        self.backend: Any = None
        self.strategy: Any = None

    def where(self) -> Placement:
        import ray

        return Placement(ray.get_runtime_context().get_node_id(),
                         tuple(sorted(os.sched_getaffinity(0))), os.getpid())

    async def start(self, cpu_threads: str | None) -> str | None:
        """Start the engine; the error text when it could not (None: ready)."""
        from refinery.eval.guarded import Guarded, build_strategy

        try:
            strategy, _ = build_strategy(self.work.strategy)
            self.backend = await make_backend(
                dataclasses.replace(self.work.backend, cpu_threads=cpu_threads))
        except Exception as exc:  # reported by the driver as one EngineStartError line
            return f"{type(exc).__name__}: {exc}"
        self.strategy = Guarded(strategy)
        return None

    async def solve(self, task: Task, gold: str | None) -> Finished:
        w = self.work
        trace = await solve_recorded(self.strategy, task, self.backend, gold=gold,
                                     spec=w.strategy, params=w.params, budget=w.budget,
                                     loop_detector=CusumLoopDetector(),
                                     loop_policy=w.loop_policy)
        return Finished(trace.model_dump_json(),
                        isinstance(trace.exception, BackendUnavailableError))

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.aclose()


def split_cpus(places: Sequence[Placement], on_gpu: bool) -> list[str | None]:
    """Each actor's share of its node's CPUs, as a vLLM bind list (None on GPU).

    Engines on one CPU node that all bind every core fight over them; split,
    each runs its own batch on its own cores.

    >>> split_cpus([Placement("n", (0, 1), 1), Placement("n", (0, 1), 2)], False)
    ['0', '1']
    """
    if on_gpu:
        return [None] * len(places)
    by_node: dict[str, list[int]] = {}
    for i, p in enumerate(places):
        by_node.setdefault(p.node, []).append(i)
    out: list[str | None] = [None] * len(places)
    for members in by_node.values():
        cpus, k = places[members[0]].cpus, len(members)
        for rank, i in enumerate(members):
            share = cpus[rank * len(cpus) // k:(rank + 1) * len(cpus) // k]
            out[i] = ",".join(map(str, share or (cpus[rank % len(cpus)],)))
    return out


@dataclass
class _Replica:
    handle: Any
    pid: int
    alive: bool = True


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise InvalidRequestError("--ray needs Ray: pip install 'refinery[ray]'",
                                  param="ray") from exc
    return ray


def _connect(ray: Any, options: RayOptions) -> bool:
    """Join or start Ray; True when this call started it (and must stop it)."""
    if ray.is_initialized():
        return False
    # A Ray started here for one run listens on loopback only.
    local = {"_node_ip_address": "127.0.0.1"} if options.address is None else {}
    try:
        ray.init(address=options.address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False, **local)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BackendUnavailableError(
            f"could not reach the Ray cluster at {options.address!r}: {exc}. A cluster "
            "started with `ray start` uses token auth: its token must be in ~/.ray/auth_token "
            "or $RAY_AUTH_TOKEN, and RAY_AUTH_MODE=token set before Ray is first imported "
            "(vLLM imports it)") from exc
    return True


def _check_fits(ray: Any, options: RayOptions) -> None:
    have = ray.cluster_resources()
    for name, each in (("CPU", options.num_cpus), ("GPU", options.num_gpus)):
        if each and options.replicas * each > have.get(name, 0):
            raise InvalidRequestError(
                f"{options.replicas} replicas x {each} {name} do not fit the Ray cluster "
                f"({have.get(name, 0):g} {name} in all); lower --ray-replicas or the per-actor "
                f"{name.lower()}s", param="replicas")


async def _start_pool(ray: Any, options: RayOptions, work: Work,
                      concurrency: int) -> list[_Replica]:
    _check_fits(ray, options)
    spec = dataclasses.replace(work.backend, tensor_parallel_size=options.tensor_parallel_size)
    actor = ray.remote(TaskActor).options(
        num_cpus=options.num_cpus, num_gpus=options.num_gpus, max_restarts=0,
        max_concurrency=concurrency + 4,  # + where/start/close beside a full batch
        runtime_env={"env_vars": dict(options.env)} if options.env else None)
    handles = [actor.remote(dataclasses.replace(work, backend=spec))
               for _ in range(options.replicas)]
    try:
        places = await asyncio.wait_for(
            asyncio.gather(*(h.where.remote() for h in handles)), options.start_timeout)
        threads = split_cpus(places, options.num_gpus > 0)
        replicas = [_Replica(h, p.pid) for h, p in zip(handles, places, strict=True)]
        errors = await asyncio.wait_for(
            asyncio.gather(*(r.handle.start.remote(t)
                             for r, t in zip(replicas, threads, strict=True))),
            options.start_timeout)
    except BaseException as exc:
        for h in handles:
            ray.kill(h)
        if isinstance(exc, TimeoutError):
            raise EngineStartError(f"{options.replicas} Ray actors did not start their "
                                   f"engines within {options.start_timeout:g} s") from exc
        raise
    if any(errors):
        await _stop_pool(ray, replicas)
        raise EngineStartError(f"a Ray actor could not start its engine: "
                               f"{next(e for e in errors if e)}")
    for p, t in zip(places, threads, strict=True):
        log.info("Ray actor pid %d on node %s: engine bound to CPUs %s", p.pid, p.node[:8], t)
    return replicas


async def _stop_pool(ray: Any, replicas: Sequence[_Replica]) -> None:
    """Close every engine (its processes go with it), then end the actors."""
    live = [r for r in replicas if r.alive]
    await asyncio.gather(*(asyncio.wait_for(r.handle.close.remote(), 60) for r in live),
                         return_exceptions=True)
    for r in replicas:
        ray.kill(r.handle)


@dataclass
class _Board:
    """The driver's shared state: tasks waiting, results arrived, tasks not yet delivered."""

    queue: deque[Task]
    results: asyncio.Queue[Trace]
    golds: Mapping[str, str | None]
    undelivered: int
    stop: asyncio.Event | None = None  # set: start nothing more (a drain)

    def drop_waiting(self) -> None:
        """Once ``stop`` is set, forget the tasks no actor has taken yet."""
        if self.stop is not None and self.stop.is_set() and self.queue:
            self.undelivered -= len(self.queue)
            self.queue.clear()


async def _feed(ray: Any, rep: _Replica, board: _Board) -> None:
    """Hand ``rep`` one task at a time until every result is in or it dies."""
    lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
    while rep.alive and board.undelivered > 0:
        board.drop_waiting()
        if not board.queue:  # a dying actor may still hand work back
            await asyncio.sleep(_IDLE_POLL)
            continue
        task = board.queue.popleft()
        try:
            done: Finished = await rep.handle.solve.remote(task, board.golds.get(task.id))
        except lost as exc:
            rep.alive = False
            board.queue.appendleft(task)
            log.warning("Ray actor pid %d is gone (%s); its tasks go to the others",
                        rep.pid, type(exc).__name__)
            return
        if done.unavailable:  # its engine died: the actor is no use any more
            rep.alive = False
            board.queue.appendleft(task)
            ray.kill(rep.handle)
            return
        board.results.put_nowait(done.trace())


async def _next_result(board: _Board, replicas: Sequence[_Replica]) -> Trace | None:
    """The next finished trace; once no actor is left, a failed one that stops the run;
    None once a drain has left nothing to wait for."""
    while True:
        try:
            return await asyncio.wait_for(board.results.get(), 0.5)
        except TimeoutError:
            if board.undelivered <= 0:  # drained: what was in flight is all in
                return None
            if any(r.alive for r in replicas) or not board.results.empty():
                continue
        task = board.queue[0]
        trace = Trace(task_id=task.id, task=task.record(board.golds.get(task.id)))
        trace.fail(BackendUnavailableError(
            f"every Ray actor is gone; {len(board.queue)} tasks unfinished"))
        return trace


async def iter_ray_run(options: RayOptions, work: Work, tasks: Sequence[Task], *,
                       concurrency: int = 64, trace_writer: TraceWriter | None = None,
                       golds: Mapping[str, str | None] | None = None,
                       stop: asyncio.Event | None = None) -> AsyncIterator[Trace]:
    """Yield each task's Trace as it finishes, solved on ``options.replicas`` Ray actors.

    The Ray counterpart of :func:`refinery.engine.run.iter_run`: the same traces
    (written here, by the one driver), ``concurrency`` tasks in flight per actor,
    and the same drain once ``stop`` is set.

    Raises:
        InvalidRequestError: Ray is not installed, or the actors do not fit the cluster.
        BackendUnavailableError: the cluster cannot be reached.
        EngineStartError: an actor's engine did not start.
    """
    ray = _ray()
    t0 = time.monotonic()
    started = _connect(ray, options)
    replicas: list[_Replica] = []
    feeders: list[asyncio.Task[None]] = []
    try:
        replicas = await _start_pool(ray, options, work, concurrency)
        ready = time.monotonic() - t0
        log.info("%d Ray actors ready in %.1f s", len(replicas), ready,
                 extra={"ready_seconds": ready})
        board = _Board(deque(tasks), asyncio.Queue(), golds or {}, len(tasks), stop)
        feeders = [asyncio.create_task(_feed(ray, r, board))
                   for r in replicas for _ in range(concurrency)]
        while board.undelivered > 0:
            trace = await _next_result(board, replicas)
            if trace is None:
                return
            if trace.exception is not None:  # no actor left: the caller stops the run
                yield trace
                return
            board.undelivered -= 1
            if trace_writer is not None:
                await trace_writer.write(trace)
            yield trace
    finally:
        for f in feeders:
            f.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)
        await _stop_pool(ray, replicas)
        if started:
            ray.shutdown()
