"""Spare uids for sandbox runs, one per concurrent run, and killing what a uid left behind.

A run that has a uid of its own can be swept clean afterwards: every process
whose uid is the run's is one of its own (a daemon it started, a forked child
holding its pipes), so :func:`kill_uid` kills exactly what the run left. The
pool hands each uid to one run at a time, across threads and processes (an
``flock`` per uid file), so a run's fork bomb is held by ``RLIMIT_NPROC`` of
its own uid and starves no other run.

Example:
    >>> pool = UidPool(first=64000, count=2)
    >>> lease = pool.acquire()
    >>> lease.uid, kill_uid(lease.uid), pool.pids()
    (64000, 0, [])
    >>> UidPool.release(lease)
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import tempfile
import time
from dataclasses import dataclass

from refinery.engine.errors import SandboxError

log = logging.getLogger(__name__)

__all__ = ["Lease", "UidPool", "kill_uid", "pids_of_uid", "task_count"]


@dataclass
class Lease:
    """A uid held for one run, and the locked file that holds it."""

    uid: int
    fd: int


class UidPool:
    """Exclusive uids across threads and processes: an flock per uid file."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count = first, count
        self.dir = os.path.join(tempfile.gettempdir(), "refinery-sandbox-uids")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self._next = 0

    def acquire(self) -> Lease:
        """The next free uid of the pool, held until :meth:`release`.

        Raises:
            SandboxError: every uid of the pool is held.
        """
        for i in range(self.count):
            uid = self.first + (self._next + i) % self.count
            fd = os.open(os.path.join(self.dir, str(uid)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._next = (self._next + i + 1) % self.count
            return Lease(uid, fd)
        raise SandboxError(f"all {self.count} sandbox uids from {self.first} are in use")

    @staticmethod
    def release(lease: Lease) -> None:
        os.close(lease.fd)  # closing drops the flock

    def pids(self) -> list[int]:
        """Live processes owned by any uid of the pool (none once every run is swept)."""
        return [pid for uid in range(self.first, self.first + self.count)
                for pid in pids_of_uid(uid)]


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real, effective or saved uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        state = uids = None
        for line in status.splitlines():
            if line.startswith(b"State:"):
                state = line.split()[1]
            elif line.startswith(b"Uid:"):
                uids = {int(x) for x in line.split()[1:]}
                break
        if uids and uid in uids and state != b"Z":
            pids.append(int(name))
    return pids


def task_count(uid: int) -> int:
    """Threads (what RLIMIT_NPROC counts) of every process whose real uid is ``uid``."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                st = os.stat(f"/proc/{name}")
                with open(f"/proc/{name}/status", "rb") as f:
                    status = f.read()
            except OSError:
                continue
            if st.st_uid != uid:
                continue
            for line in status.splitlines():
                if line.startswith(b"Threads:"):
                    total += int(line.split()[1])
                    break
    return total


def kill_uid(uid: int, timeout: float = 5.0) -> int:
    """SIGKILL every live process whose real, effective or saved uid is ``uid``.

    Loops until none is left (a process may fork while we scan) or ``timeout``.
    Returns how many kills were sent.
    """
    sent = 0
    deadline = time.monotonic() + timeout
    while True:
        pids = pids_of_uid(uid)
        if not pids:
            return sent
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                sent += 1
        if time.monotonic() > deadline:
            log.error("sandbox uid %d still has processes %s after %.1fs", uid, pids, timeout)
            return sent
        time.sleep(0.005)
