"""OptiLLM's moa, re2 and cot_reflection on 4 real GSM8K problems with the embedded
model: no errors, usage reported, traces written, re-readable and holding each
method's steps.

The three run at once so their calls batch in one vLLM engine; generations are
capped at 128 tokens, as in test_strategies.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from refinery.engine.trace import Trace
from refinery.strategies.cot_reflection import section
from tests.e2e.solving import gsm8k_tasks, run_specs

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
    runs = await run_specs(SPECS, gsm8k_tasks(4), vllm_backend, tmp_path)
    for spec, r in runs.items():
        for trace in r.written:
            CHECKS[spec](trace)
    sources = Counter(t.attempt.metadata["output_from"] for t in runs["cot_reflection"].traces)
    print(f"cot_reflection output_from={dict(sources)}")
