"""Trace pages drawn in a worker process, so that drawing one never slows the server.

Drawing the largest trace the explorer shows (``traceview.MAX_EVENTS`` events) is
about a second of Python: parsing a 7 MB line, building the tree, rendering a
10 MB page. In a thread of the server it holds the GIL for most of that second,
and every other request gets it back only in slices (``bench/ui_load.py``
measured a static file delayed by up to 252 ms). In a process of its own it
holds nothing the server needs.

One :class:`Drawer` serves the whole server process (:data:`DRAWER`: the page's
apps differ only in their settings, which travel with each call). Its pool of
:data:`DRAW_PROCESSES` workers is started by the app's start
(:meth:`Drawer.warm`) or the first page, and ended by the app's shutdown
(:meth:`Drawer.close`, which kills a drawing in progress) or at exit. Pages are
admitted by what they cost (the bytes of trace they parse), each client to a
share, and drawn with the clients taking turns; a worker's address space is
bounded (``RLIMIT_AS``), so a page too large for it is a 413, not the OOM killer.
Workers are spawned, not forked: the server has threads (and under ``refinery
serve`` an engine) that a fork would copy in an unknown state. What crosses the
pipe is picklable by design: a module-level function, the settings and the
request's strings or form body in; the page's bytes, or the ``RefineryError``
that makes it a 4xx, out.

Example:
    >>> html = await DRAWER.draw(draw_run_trace, settings, "cot-arith", "arith-test-0",
    ...                          cost=PAGE_COST, client=client)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import resource
import signal
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from refinery.engine.errors import OverCapacityError, RefineryError
from refinery.ui.runs import MAX_TRACE_BYTES

DRAW_PROCESSES = 1  # on 2 cores: one draws, one is left to the server
PAGE_COST = 64 << 10  # what a page costs to admit, besides the bytes of trace it parses
CLIENT_SHARE = 2 * (MAX_TRACE_BYTES + PAGE_COST)  # one client's: two of the largest traces
MAX_COST = 4 * CLIENT_SHARE  # admitted at once (drawing, or waiting with its form body)
DRAW_NICENESS = 10  # the workers' priority below the server's (os.nice)
# A worker's address space (RLIMIT_AS): the largest trace peaks at about 470 MB of it
# (bench/ui_load.py's, 7.2 MB); past the limit a page is a MemoryError, not the OOM killer.
DRAW_MEMORY_BYTES = 2 << 30


class DrawingStoppedError(RefineryError):
    """The worker process died while drawing (killed, out of memory); the next page
    starts a new one."""

    status = 503
    type = "service_unavailable"


class DrawingTooLargeError(RefineryError):
    """A page that needs more memory than a drawing worker may use."""

    status = 413
    type = "invalid_request_error"


@dataclass
class _Job:
    fn: Callable[..., bytes]
    args: tuple[Any, ...]
    cost: int
    client: Hashable
    done: Future[bytes] = field(default_factory=Future)


class Drawer:
    """A small process pool drawing pages: started lazily, replaced when broken, killed
    by :meth:`close`.

    Work is admitted by cost (the bytes of trace it parses, plus :data:`PAGE_COST`):
    at most ``max_cost`` at a time, of which at most ``client_share`` one client's;
    past either, a 429. Admitted pages wait here, not in the pool, and go to the
    workers one at a time per free worker, taking the clients in turn: a client with
    eight large drawings waiting holds back another's small page by one drawing, not
    eight.
    """

    def __init__(self, processes: int = DRAW_PROCESSES, max_cost: int = MAX_COST,
                 client_share: int = CLIENT_SHARE, memory: int | None = DRAW_MEMORY_BYTES):
        self.processes, self.max_cost, self.client_share = processes, max_cost, client_share
        self.memory = memory
        self._pool: ProcessPoolExecutor | None = None
        self._waiting: dict[Hashable, deque[_Job]] = {}
        self._cost: dict[Hashable, int] = {}  # admitted cost per client
        self._served: dict[Hashable, int] = {}  # the turn each client was last served
        self._turns = 0
        self._running = 0
        # A threading lock, not an asyncio one: the apps using the drawer may run on
        # different event loops (each TestClient has its own).
        self._lock = threading.Lock()

    async def draw(self, fn: Callable[..., bytes], *args: Any, cost: int = PAGE_COST,
                   client: Hashable = "") -> bytes:
        """``fn(*args)`` in a worker process, admitted as ``cost`` of ``client``'s.

        Raises:
            OverCapacityError: admitting it would pass ``max_cost``, or ``client``'s
                share of it.
            DrawingStoppedError: the worker died (or was stopped) before it answered.
            DrawingTooLargeError: the page needs more memory than a worker may use.
            RefineryError: what ``fn`` raised (a missing run, a file that is no trace).
        """
        job = _Job(fn, args, cost, client)
        self._admit(job)
        try:
            return await asyncio.wrap_future(job.done)
        except BrokenProcessPool:
            raise DrawingStoppedError("the process drawing trace pages stopped before it "
                                      "answered; reload the page to start a new one") from None
        except MemoryError:
            raise DrawingTooLargeError("this page needs more memory than the drawing "
                                       f"process may use ({self.memory:,} bytes)") from None

    def _admit(self, job: _Job) -> None:
        with self._lock:
            total, own = sum(self._cost.values()), self._cost.get(job.client, 0)
            if total + job.cost > self.max_cost or own + job.cost > self.client_share:
                raise OverCapacityError(
                    f"{total:,} bytes of pages are being drawn ({own:,} of them yours); "
                    "try again in a moment", code="drawing_busy")
            self._cost[job.client] = own + job.cost
            self._waiting.setdefault(job.client, deque()).append(job)
        self._dispatch()

    def _dispatch(self) -> None:
        """Send waiting jobs to the pool while a worker is free, the clients in turn."""
        while True:
            with self._lock:
                if self._running >= self.processes or not self._waiting:
                    return
                # The client served longest ago (one never served first): in turns.
                client = min(self._waiting, key=lambda c: self._served.get(c, -1))
                jobs = self._waiting[client]
                job = jobs.popleft()
                if not jobs:
                    del self._waiting[client]
                self._turns += 1
                self._served[client] = self._turns
                self._running += 1
                pool = self._started()
            if job.done.set_running_or_notify_cancel():
                self._submit(pool, job)
            else:  # its request went away while it waited
                self._finish(job)

    def _submit(self, pool: ProcessPoolExecutor, job: _Job) -> None:
        try:
            future = pool.submit(job.fn, *job.args)
        except BrokenProcessPool:  # its worker died between two drawings
            self._discard(pool)
            with self._lock:
                pool = self._started()
            try:
                future = pool.submit(job.fn, *job.args)
            except Exception as exc:  # shut down meanwhile (close)
                return self._finish(job, error=exc)
        except RuntimeError as exc:  # shut down meanwhile (close)
            return self._finish(job, error=BrokenProcessPool(str(exc)))
        future.add_done_callback(lambda f: self._done(job, f, pool))

    def _done(self, job: _Job, future: Future[bytes], pool: ProcessPoolExecutor) -> None:
        error = future.exception()
        if isinstance(error, BrokenProcessPool):
            self._discard(pool)
        self._finish(job, None if error else future.result(), error)

    def _finish(self, job: _Job, result: bytes | None = None,
                error: BaseException | None = None, ran: bool = True) -> None:
        """Release ``job``'s cost (and its worker, if it ``ran``), answer it, and send
        the next one."""
        with self._lock:
            self._running -= ran
            left = self._cost.get(job.client, 0) - job.cost
            if left > 0:
                self._cost[job.client] = left
            else:  # nothing of it left: forgotten, its next page a first one
                self._cost.pop(job.client, None)
                self._served.pop(job.client, None)
        if job.done.running():  # not when its request went away meanwhile
            if error is not None:
                job.done.set_exception(error)
            else:
                job.done.set_result(result)
        self._dispatch()

    def _started(self) -> ProcessPoolExecutor:
        """The pool, made now if there is none (under the lock). Its workers start with
        the first drawing, not here."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started, initargs=(self.memory,))
        return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Drop ``pool``, broken, unless another already replaced it."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False)

    def warm(self) -> None:
        """Start the worker now, in the background (a spawned worker takes a second or
        more to import the page's code), so the first page does not wait for it."""
        with self._lock:
            pool = self._started()
        try:
            pool.submit(_ready)
        except (BrokenProcessPool, RuntimeError):  # broken or closed: the next page starts one
            self._discard(pool)

    def pids(self) -> list[int]:
        """The ids of the worker processes running now (none before the first drawing)."""
        with self._lock:
            return [w.pid for w in _workers(self._pool) if w.is_alive()]

    def admitted(self) -> dict[Hashable, int]:
        """The cost admitted now (drawing or waiting) per client."""
        with self._lock:
            return dict(self._cost)

    def close(self) -> None:
        """Stop the workers now, a drawing in progress included (its request gets a
        503): at shutdown a page nobody may wait for is not worth the wait."""
        with self._lock:
            pool, self._pool = self._pool, None
            waiting = [job for jobs in self._waiting.values() for job in jobs]
            self._waiting.clear()
        for job in waiting:  # never started: they fail as the drawings in progress do
            job.done.set_running_or_notify_cancel()
            self._finish(job, error=BrokenProcessPool("closed"), ran=False)
        if pool is None:
            return
        workers = _workers(pool)
        pool.shutdown(wait=False)
        for worker in workers:
            worker.kill()  # drawings still queued then fail as BrokenProcessPool: a 503
        for worker in workers:
            worker.join(timeout=10)


def _workers(pool: ProcessPoolExecutor | None) -> list[multiprocessing.Process]:
    # The executor's own record of its processes: Python 3.11 has no public one, nor a
    # way to stop a busy worker (3.14 adds terminate_workers and kill_workers).
    return list((getattr(pool, "_processes", None) or {}).values())


def _ready() -> bytes:
    """The drawing :meth:`Drawer.warm` sends: nothing, once the worker is up."""
    return b""


def _worker_started(memory: int | None) -> None:
    """In each worker: a bounded address space, the CPU yielded to the server, and
    Ctrl-C left to it.

    At a lower priority the kernel runs the server's event loop as soon as a request
    wakes it, instead of sharing a busy core with the drawing: the page takes longer
    only when the cores are contended. Ctrl-C in a terminal reaches the whole process
    group; the server stops its workers itself (:meth:`Drawer.close`).
    """
    if memory is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.nice(DRAW_NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


DRAWER = Drawer()
