"""Traces: every generation and strategy step of a task, as a provenance DAG.

Events reference their parents by id, so a task's trace is a DAG (networkx
for analysis and rendering). ``TraceWriter`` appends one JSON line per task,
written whole with a single ``write`` of a complete line and an fsync, so a
crash never leaves a torn line that a reader would half-parse.

Example:
    >>> trace = Trace(task_id="t1")
    >>> eid = trace.add(TraceEvent(kind="step", step="draft", strategy="cot", text="4"))
    >>> trace.graph().number_of_nodes()
    1
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field

from engine.types import Attempt, Completion, Message, Usage

EventKind = Literal["generation", "step", "verdict", "error"]
StepKind = Literal["draft", "critique", "decompose", "resolve", "refine", "plan",
                   "review", "vote", "select", "judge", "loop_retry", "final", "other"]

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
    """All events of one task, plus its final attempt."""

    task_id: str
    strategy: str = ""
    model: str = ""
    events: list[TraceEvent] = Field(default_factory=list)
    attempt: Attempt | None = None
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0
    error: str | None = None

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


class TraceWriter:
    """Append-only JSONL sink: one task per line, each line written whole.

    Raises OSError (e.g. ENOSPC) loudly rather than dropping a trace.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = asyncio.Lock()

    def write_sync(self, trace: Trace) -> None:
        line = (trace.model_dump_json() + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # O_APPEND + one write per line: concurrent writers never interleave
            # inside a line, and a crash leaves either the whole line or none
            # (a partial final line is dropped by read_traces).
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(f"short write to {self.path} ({written}/{len(line)} bytes)")
            os.fsync(fd)
        finally:
            os.close(fd)

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
