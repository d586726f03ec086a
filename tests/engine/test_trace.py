"""Trace DAG, rendering and the whole-line JSONL writer."""

from __future__ import annotations

import asyncio
import os

from refinery.engine.errors import BackendUnavailableError
from refinery.engine.trace import Trace, TraceEvent, TraceWriter, read_traces
from refinery.engine.types import Attempt, Completion, Usage


def sample_trace(task_id: str = "t1") -> Trace:
    t = Trace(task_id=task_id, strategy="sc(cot)", model="m")
    a = t.add(TraceEvent(kind="generation", step="draft", strategy="cot", completions=[
        Completion(text="x = 4", prompt_tokens=3, completion_tokens=2, finish_reason="stop")],
        usage=Usage(prompt_tokens=3, completion_tokens=2, calls=1)))
    b = t.add(TraceEvent(kind="generation", step="critique", strategy="cr", parents=[a]))
    t.add(TraceEvent(kind="step", step="select", strategy="sc", parents=[a, b], text="4"))
    t.attempt = Attempt(text="x = 4", answer="4")
    return t


def test_graph_is_a_dag_with_parent_edges():
    t = sample_trace()
    g = t.graph()
    ids = [e.id for e in t.events]
    assert set(g.edges) == {(ids[0], ids[1]), (ids[0], ids[2]), (ids[1], ids[2])}
    rendered = t.render()
    assert "[generation:draft] cot" in rendered and "answer: '4'" in rendered


def test_writer_appends_whole_lines_and_reader_skips_a_torn_tail(tmp_path):
    path = tmp_path / "traces.jsonl"
    w = TraceWriter(path)

    async def write_many():
        await asyncio.gather(*(w.write(sample_trace(f"t{i}")) for i in range(20)))

    asyncio.run(write_many())
    with open(path, "ab") as f:  # a crash mid-write leaves a partial last line
        f.write(b'{"task_id": "torn", "eve')
    back = read_traces(path)
    assert sorted(t.task_id for t in back) == sorted(f"t{i}" for i in range(20))
    assert back[0].events[0].completions[0].text == "x = 4"
    assert all(line.endswith(b"}") for line in path.read_bytes().split(b"\n")[:-1])


def test_writer_reports_a_full_disk(tmp_path, monkeypatch):
    w = TraceWriter(tmp_path / "t.jsonl")

    def short_write(fd, data):
        return len(data) // 2

    monkeypatch.setattr(os, "write", short_write)
    try:
        w.write_sync(sample_trace())
    except OSError as exc:
        assert "short write" in str(exc)
    else:
        raise AssertionError("a short write must raise")


def test_the_exception_stays_in_process_and_old_lines_load() -> None:
    trace = Trace(task_id="t1")
    exc = BackendUnavailableError("engine down")
    trace.fail(exc)
    assert trace.exception is exc and trace.error == "BackendUnavailableError: engine down"
    back = Trace.model_validate_json(trace.model_dump_json())
    assert back.error == trace.error and back.exception is None
    old = '{"task_id": "t0", "strategy": "cot", "error": "budget exhausted before any answer"}'
    assert Trace.model_validate_json(old).task is None
