"""OptiLLM's moa, re2 and cot_reflection on 4 real GSM8K problems with the embedded
model: no errors, usage reported, traces written, re-readable and holding each
method's steps.

The three run at once so their calls batch in one vLLM engine; generations are
capped at 128 tokens, as in test_strategies.py.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from refinery.engine.loops import CusumLoopDetector
from refinery.engine.run import run
from refinery.engine.trace import Trace, TraceWriter, read_traces
from refinery.engine.types import SamplingParams
from refinery.strategies import build_with_graph
from refinery.strategies.cot_reflection import section
from tests.e2e.test_strategies import gsm8k_tasks

pytestmark = pytest.mark.e2e

SPECS = ["moa", "re2", "cot_reflection"]


def generations(trace: Trace) -> list[tuple[str, str]]:
    return [(e.strategy, e.step) for e in trace.events if e.kind == "generation"]


def check_moa(trace: Trace) -> None:
    assert {("cot", "draft"), ("moa", "critique"), ("moa", "refine")} <= set(generations(trace))
    [draft] = [e for e in trace.events if e.step == "draft"]
    assert len(draft.completions) == 3  # the three drafts are one request
    by_id = {e.id: e for e in trace.events}
    assert by_id[trace.attempt.events[0]].step in {"refine", "loop_retry"}  # the synthesis
    assert trace.attempt.metadata["drafts"] == 3


def check_re2(trace: Trace) -> None:
    [draft] = [e for e in trace.events if e.step == "draft"]
    assert draft.strategy == "re2"
    assert draft.messages[-1].content.count(trace.task.question) == 2


def check_cot_reflection(trace: Trace) -> None:
    [draft] = [e for e in trace.events if e.step == "draft"]
    assert trace.attempt.metadata["output_from"] in {"output", "after_reflection", "whole_text"}
    if any(e.step == "loop_retry" for e in trace.events):
        return  # the attempt was split from the retried reply
    raw = draft.completions[0].text
    steps = [e.step for e in trace.events if e.kind == "step"]
    expected = [k for k in ("thinking", "reflection") if section(raw, k) is not None]
    assert steps == expected, (steps, raw[:300])


CHECKS = {"moa": check_moa, "re2": check_re2, "cot_reflection": check_cot_reflection}


async def test_optillm_strategies_complete_on_4_gsm8k_problems(vllm_backend, tmp_path):
    tasks = gsm8k_tasks(4)
    params = SamplingParams(temperature=0.7, max_tokens=128)

    async def one(spec: str):
        strategy, _ = build_with_graph(spec)
        writer = TraceWriter(tmp_path / f"{spec}.jsonl")
        traces = await run(strategy, tasks, vllm_backend, concurrency=4, params=params,
                           trace_writer=writer, spec=spec, loop_detector=CusumLoopDetector(),
                           on_error="raise")
        return spec, traces, writer.path

    results = await asyncio.gather(*(one(s) for s in SPECS))
    report = []
    for spec, traces, path in results:
        assert [t.task_id for t in traces] == [t.id for t in tasks]
        assert all(t.error is None and t.attempt is not None for t in traces), spec
        assert all(t.usage.calls >= 1 and t.usage.completion_tokens > 0 for t in traces)
        back = read_traces(path)
        assert sorted(t.task_id for t in back) == sorted(t.id for t in tasks)
        for trace in back:
            CHECKS[spec](trace)
        calls = sum(t.usage.calls for t in traces)
        toks = sum(t.usage.total_tokens for t in traces)
        answers = [t.attempt.answer for t in traces]
        extra = ""
        if spec == "cot_reflection":
            sources = Counter(t.attempt.metadata["output_from"] for t in traces)
            extra = f" output_from={dict(sources)}"
        report.append(f"{spec}: calls={calls} tokens={toks} answers={answers}{extra}")
    print("\n".join(report))
