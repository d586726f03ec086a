"""Run several strategy specs at once on real tasks and check what every run must hold.

Shared by the every-strategy and the OptiLLM-strategy e2e tests: all specs run
concurrently so their calls batch in the one vLLM engine, each writes its
traces, and every run is checked the same way before a test checks its own.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from refinery.engine.backends.base import Backend
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.run import run
from refinery.engine.trace import Trace, TraceWriter, read_traces
from refinery.engine.types import SamplingParams, Task
from refinery.strategies import build_with_graph
from tests.conftest import GSM8K


def gsm8k_tasks(n: int = 4) -> list[Task]:
    with open(GSM8K / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(n)]
    return [Task.from_prompt(r["question"], id=f"gsm8k-{i}") for i, r in enumerate(rows)]


@dataclass
class SpecRun:
    """One spec's traces as returned, and as read back from its trace file."""

    spec: str
    traces: list[Trace]
    written: list[Trace]
    seconds: float  # from the common start to this spec's last answer

    def line(self) -> str:
        calls = sum(t.usage.calls for t in self.traces)
        tokens = sum(t.usage.total_tokens for t in self.traces)
        return f"{self.spec}: calls={calls} tokens={tokens} done after {self.seconds:.0f}s"


async def run_specs(specs: list[str], tasks: list[Task], backend: Backend, out: Path, *,
                    max_tokens: int = 128) -> dict[str, SpecRun]:
    """Every spec on every task, at once; each run checked: no error, an attempt and
    usage per task, and its trace file holding every task again."""
    params = SamplingParams(temperature=0.7, max_tokens=max_tokens)
    start = time.monotonic()

    async def one(i: int, spec: str) -> SpecRun:
        strategy, _ = build_with_graph(spec)
        writer = TraceWriter(out / f"{i}-{spec.split('(')[0]}.jsonl")
        traces = await run(strategy, tasks, backend, concurrency=len(tasks), params=params,
                           trace_writer=writer, spec=spec, loop_detector=CusumLoopDetector(),
                           on_error="raise")
        return SpecRun(spec, traces, read_traces(writer.path), time.monotonic() - start)

    runs = await asyncio.gather(*(one(i, s) for i, s in enumerate(specs)))
    for r in runs:
        assert [t.task_id for t in r.traces] == [t.id for t in tasks], r.spec
        assert all(t.error is None and t.attempt is not None for t in r.traces), r.spec
        assert all(t.usage.calls >= 1 and t.usage.completion_tokens > 0 for t in r.traces)
        assert sorted(t.task_id for t in r.written) == sorted(t.id for t in tasks), r.spec
    print("\n".join(r.line() for r in runs))
    return {r.spec: r for r in runs}
