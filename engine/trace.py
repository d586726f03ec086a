"""Traces: every generation and strategy step of a task, as a provenance DAG.

Events reference their parents by id, so a task's trace is a DAG (networkx
for analysis and rendering). ``TraceWriter`` appends one JSON line per task,
written whole with a single ``write`` of a complete line and an fsync. A kill
in the middle of that write can leave at most an unterminated last line:
``read_traces`` skips it and the next ``TraceWriter`` on the file cuts it off
before appending, so no line in the middle of a file is ever torn. A write
that fails (disk full) raises :class:`~refinery.engine.errors.StorageError` naming the
file; the partial bytes are removed, not left behind.

Example:
    >>> trace = Trace(task_id="t1")
    >>> eid = trace.add(TraceEvent(kind="step", step="draft", strategy="cot", text="4"))
    >>> trace.graph().number_of_nodes()
    1
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field, PrivateAttr

from refinery.engine.errors import StorageError
from refinery.engine.types import Attempt, Completion, Message, TaskRecord, Usage

EventKind = Literal["generation", "step", "verdict", "error"]
StepKind = Literal["draft", "critique", "decompose", "resolve", "refine", "plan",
                   "review", "vote", "select", "judge", "loop_retry", "final",
                   "thinking", "reflection", "threshold", "execute", "continue", "search",
                   "memory", "other"]

_ids = itertools.count()


class TraceEvent(BaseModel):
    """One node of the provenance DAG."""

    id: str = ""
    kind: EventKind
    step: StepKind = "other"
    strategy: str = ""
    parents: list[str] = Field(default_factory=list)
    time: float = Field(default_factory=time.time)
    seconds: float = 0.0
    text: str | None = None
    messages: list[Message] | None = None
    params: dict[str, Any] | None = None
    completions: list[Completion] | None = None
    usage: Usage | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class Trace(BaseModel):
    """All events of one task, plus its final attempt.

    ``error`` is the text of what ended the task without an attempt; in the
    process that ran it, :attr:`exception` is the exception itself, so callers
    decide by its type (it is not written to the file).
    """

    task_id: str
    task: TaskRecord | None = None  # None in traces written before it was recorded
    strategy: str = ""
    model: str = ""
    events: list[TraceEvent] = Field(default_factory=list)
    attempt: Attempt | None = None
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0
    error: str | None = None
    _exception: BaseException | None = PrivateAttr(default=None)

    @property
    def exception(self) -> BaseException | None:
        """The exception behind ``error`` (None when read back from a file)."""
        return self._exception

    def fail(self, exc: BaseException, message: str | None = None) -> None:
        """Record ``exc`` as what ended the task (``message`` overrides the text)."""
        self._exception = exc
        self.error = message or f"{type(exc).__name__}: {exc}"

    def add(self, event: TraceEvent) -> str:
        if not event.id:
            event.id = f"e{next(_ids)}"
        self.events.append(event)
        return event.id

    def graph(self) -> nx.DiGraph:
        """Edges run from parent to child."""
        g = nx.DiGraph()
        for e in self.events:
            g.add_node(e.id, kind=e.kind, step=e.step, strategy=e.strategy)
        for e in self.events:
            for p in e.parents:
                if p in g:
                    g.add_edge(p, e.id)
        return g

    def render(self, width: int = 100) -> str:
        """An indented tree of the DAG (children under their first parent)."""
        g = self.graph()
        by_id = {e.id: e for e in self.events}
        lines = [f"task {self.task_id}  strategy={self.strategy}  model={self.model}  "
                 f"calls={self.usage.calls} tokens={self.usage.total_tokens} "
                 f"seconds={self.seconds:.1f}"]

        def label(e: TraceEvent) -> str:
            if e.kind == "generation":
                comps = e.completions or []
                first = comps[0].text if comps else ""
                fr = ",".join(sorted({c.finish_reason for c in comps}))
                u = e.usage or Usage()
                body = f"n={len(comps)} tokens={u.completion_tokens} finish={fr} | {first}"
            else:
                body = e.text or json.dumps(e.data)[:200]
            body = " ".join(body.split())
            return f"[{e.kind}:{e.step}] {e.strategy}: {body}"[:width]

        seen: set[str] = set()

        def walk(nid: str, depth: int) -> None:
            if nid in seen:
                lines.append("  " * depth + f"(see {nid})")
                return
            seen.add(nid)
            lines.append("  " * depth + f"{nid} " + label(by_id[nid]))
            for child in g.successors(nid):
                if by_id[child].parents and by_id[child].parents[0] == nid:
                    walk(child, depth + 1)

        for e in self.events:
            if not [p for p in e.parents if p in by_id]:
                walk(e.id, 1)
        if self.attempt is not None:
            lines.append(f"answer: {self.attempt.answer!r}")
        if self.error:
            lines.append(f"error: {self.error}")
        return "\n".join(lines)


def append_whole_line(path: str | os.PathLike[str], line: bytes, *, what: str = "line") -> None:
    """Append ``line`` (ending in a newline) with one ``O_APPEND`` write, then ``fsync``.

    An exclusive ``flock`` is held for the write, so :func:`repair_tail` in
    another process never mistakes a line being written for a torn one.

    Args:
        path: The JSONL file (created if missing).
        line: One complete line, newline-terminated.
        what: What the line is ("result", "trace"), for the error message.

    Raises:
        StorageError: The line could not be written whole (ENOSPC, EFBIG, EROFS...);
            any part of it that reached the file has been cut off again.
    """
    fd = -1
    start = None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        start = os.fstat(fd).st_size
        written = os.write(fd, line)
        if written != len(line):
            # A short write to a regular file means the device or a limit ran out.
            raise OSError(f"short write ({written}/{len(line)} bytes; disk full?)")
        os.fsync(fd)
    except OSError as exc:
        if fd >= 0 and start is not None:
            # Leave no partial line behind; the lock keeps other writers out meanwhile.
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_size > start:
                    os.ftruncate(fd, start)
        reason = exc.strerror or str(exc)
        err = StorageError(f"could not write a {what} to {path}: {reason}. Nothing was "
                           "half-written; free space (or fix the path) and retry.",
                           code=_errno_name(exc.errno))
        err.errno = exc.errno
        raise err from exc
    finally:
        if fd >= 0:
            os.close(fd)


def _errno_name(num: int | None) -> str | None:
    """``ENOSPC`` for 28, ``None`` when there is no errno."""
    return errno.errorcode.get(num) if num else None


def repair_tail(path: str | os.PathLike[str]) -> int:
    """Cut an unterminated last line (a writer killed mid-write) off a JSONL file.

    Only regular files are touched, under the same ``flock`` writers take.

    Returns:
        How many bytes were cut (0 when the file ends with a newline or is missing).
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise StorageError(f"cannot open {path} to check its last line: {exc.strerror}",
                           code=_errno_name(exc.errno)) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return 0
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        # Scan back from the end in blocks: lines can be megabytes long.
        pos, block = size, 65536
        while pos > 0:
            lo = max(0, pos - block)
            chunk = os.pread(fd, pos - lo, lo)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                cut = lo + nl + 1
                break
            pos = lo
        else:
            cut = 0
        if cut < size:
            os.ftruncate(fd, cut)
            os.fsync(fd)
        return size - cut
    finally:
        os.close(fd)


class TraceWriter:
    """Append-only JSONL sink: one task per line, each line written whole.

    Creating a writer cuts a torn last line left by a killed writer (one
    process writes a file at a time; concurrent tasks of that process are
    serialised here). Raises :class:`~refinery.engine.errors.StorageError` (an
    ``OSError``, e.g. ENOSPC) loudly rather than dropping a trace.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()
        self.repaired = repair_tail(self.path)

    def write_sync(self, trace: Trace) -> None:
        append_whole_line(self.path, (trace.model_dump_json() + "\n").encode(), what="trace")

    async def write(self, trace: Trace) -> None:
        async with self._lock:
            await asyncio.to_thread(self.write_sync, trace)


def read_traces(path: str | os.PathLike[str]) -> list[Trace]:
    """Read a trace file; a torn last line (crash mid-write) is skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            out.append(Trace.model_validate_json(line))
    return out
