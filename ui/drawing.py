"""Trace pages drawn in a worker process, so that drawing one never slows the server.

Drawing the largest trace the explorer shows (``traceview.MAX_EVENTS`` events) is
about a second of Python: parsing a 7 MB line, building the tree, rendering a
10 MB page. In a thread of the server it holds the GIL for most of that second,
and every other request gets it back only in slices (``bench/ui_load.py``
measured a static file delayed by up to 252 ms). In a process of its own it
holds nothing the server needs.

One :class:`Drawer` serves the whole server process (:data:`DRAWER`: the page's
apps differ only in their settings, which travel with each call). Its pool of
:data:`DRAW_PROCESSES` workers is started by the first trace page and ended by
the app's shutdown (:meth:`Drawer.close`, which kills a drawing in progress) or
at exit. Workers are spawned, not forked: the server has threads (and under
``refinery serve`` an engine) that a fork would copy in an unknown state. What
crosses the pipe is picklable by design: a module-level function, the settings
and the request's strings or form body in; the page's bytes, or the
``RefineryError`` that makes it a 4xx, out.

Example:
    >>> html = await DRAWER.draw(draw_run_trace, settings, "cot-arith", "arith-test-0")
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from refinery.engine.errors import OverCapacityError, RefineryError

DRAW_PROCESSES = 1  # on 2 cores: one draws, one is left to the server
MAX_WAITING = 8  # drawings queued or in progress, then 429: each holds a page in memory
DRAW_NICENESS = 10  # the workers' priority below the server's (os.nice)


class DrawingStoppedError(RefineryError):
    """The worker process died while drawing (killed, out of memory); the next page
    starts a new one."""

    status = 503
    type = "service_unavailable"


class Drawer:
    """A small process pool drawing pages: started lazily, at most ``max_waiting``
    drawings in it at a time, replaced when broken, killed by :meth:`close`."""

    def __init__(self, processes: int = DRAW_PROCESSES, max_waiting: int = MAX_WAITING):
        self.processes, self.max_waiting = processes, max_waiting
        self._pool: ProcessPoolExecutor | None = None
        self._waiting = 0
        # A threading lock, not an asyncio one: the apps using the drawer may run on
        # different event loops (each TestClient has its own).
        self._lock = threading.Lock()

    async def draw(self, fn: Callable[..., bytes], *args: Any) -> bytes:
        """``fn(*args)`` in a worker process.

        Raises:
            OverCapacityError: ``max_waiting`` drawings are already waiting.
            DrawingStoppedError: the worker died (or was stopped) before it answered.
            RefineryError: what ``fn`` raised (a missing run, a file that is no trace).
        """
        pool, future = self._submit(fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except BrokenProcessPool:
            self._discard(pool)
            raise DrawingStoppedError("the process drawing trace pages stopped before it "
                                      "answered; reload the page to start a new one") from None

    def _submit(self, fn: Callable[..., bytes],
                *args: Any) -> tuple[ProcessPoolExecutor, Future[bytes]]:
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise OverCapacityError(f"{self._waiting} trace pages are being drawn; "
                                        "try again in a moment", code="drawing_busy")
            pool = self._started()
            try:
                future = pool.submit(fn, *args)
            except BrokenProcessPool:  # its worker died between two drawings
                self._pool = None
                pool = self._started()
                future = pool.submit(fn, *args)
            self._waiting += 1
        future.add_done_callback(self._done)
        return pool, future

    def _started(self) -> ProcessPoolExecutor:
        """The pool, made now if there is none (under the lock). Its workers start with
        the first drawing, not here."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started)
        return self._pool

    def _done(self, _: Future[bytes]) -> None:
        with self._lock:
            self._waiting -= 1

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        """Drop ``pool``, broken, unless another already replaced it."""
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False)

    def pids(self) -> list[int]:
        """The ids of the worker processes running now (none before the first drawing)."""
        with self._lock:
            return [w.pid for w in _workers(self._pool) if w.is_alive()]

    def close(self) -> None:
        """Stop the workers now, a drawing in progress included (its request gets a
        503): at shutdown a page nobody may wait for is not worth the wait."""
        with self._lock:
            pool, self._pool = self._pool, None
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


def _worker_started() -> None:
    """In each worker: yield the CPU to the server, and leave Ctrl-C to it.

    At a lower priority the kernel runs the server's event loop as soon as a request
    wakes it, instead of sharing a busy core with the drawing: the page takes longer
    only when the cores are contended. Ctrl-C in a terminal reaches the whole process
    group; the server stops its workers itself (:meth:`Drawer.close`).
    """
    os.nice(DRAW_NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


DRAWER = Drawer()
