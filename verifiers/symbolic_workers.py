"""Symbolic answer comparison in worker processes, each call hard-limited in time.

sympy can hang on a hostile answer (``10**10**10``), and a thread cannot be
stopped, so every comparison runs in a subprocess
(:mod:`refinery.verifiers._symworker`) that is killed when it overruns. Up to two
workers are kept warm and shared by every thread of the process; a worker that
timed out or died is never reused.

Example:
    >>> symbolic_compare("x^2+2x+1", "(x+1)^2", timeout=5.0)
    (True, 'math-verify')
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["symbolic_compare"]


class _Worker:
    """One symbolic-comparison subprocess (``refinery.verifiers._symworker``), JSON lines."""

    def __init__(self) -> None:
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "refinery.verifiers._symworker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,  # a Ctrl-C at the terminal must not kill it mid-call
        )
        self._buf = b""
        ready = self._read_line(timeout=60.0)
        if ready is None or json.loads(ready).get("ready") is not True:
            self.kill()
            raise RuntimeError("symbolic worker did not start")

    def _read_line(self, timeout: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None  # worker died
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def compare(self, a: str, b: str, timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdin is not None
        req = json.dumps({"a": a, "b": b, "timeout": timeout}) + "\n"
        try:
            self.proc.stdin.write(req.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._read_line(timeout)
        return None if line is None else json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


class _WorkerPool:
    """Up to ``size`` symbolic workers shared by every thread of the process."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        atexit.register(self.close)

    def _acquire(self) -> _Worker:
        with self._cond:
            while not self._idle and self._count >= self.size:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._count += 1
        try:
            return _Worker()
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is not None and worker.alive():
                self._idle.append(worker)
            else:
                self._count -= 1
            self._cond.notify()

    def compare(self, a: str, b: str, timeout: float) -> dict[str, Any] | None:
        worker = self._acquire()
        result = None
        try:
            result = worker.compare(a, b, timeout)
        finally:
            if result is None:  # timed out or died: never reuse a worker in an unknown state
                worker.kill()
                self._release(None)
            else:
                self._release(worker)
        return result

    def close(self) -> None:
        with self._cond:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_POOL = _WorkerPool()


def symbolic_compare(a: str, b: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Symbolic equivalence of two answers in a worker process, hard-limited to ``timeout`` s.

    Returns ``(equal, how)``; ``how`` names the method that decided or says
    ``timeout``. Never blocks longer than ``timeout`` (plus a worker start,
    about a second, the first time).
    """
    try:
        res = _POOL.compare(a, b, timeout)
    except RuntimeError as e:
        log.error("symbolic comparison unavailable: %s", e)
        return False, "unavailable"
    if res is None:
        log.warning("symbolic comparison timed out after %.1fs: %.80r vs %.80r", timeout, a, b)
        return False, "timeout"
    return bool(res.get("equal")), str(res.get("method", "symbolic"))
