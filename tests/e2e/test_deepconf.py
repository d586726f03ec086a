"""deepconf on the real model, in-process (AsyncLLM) and through vLLM's own OpenAI
server: traces measured from the engine's top-k logprobs, later traces stopped
where their confidence fell below the warm-up's threshold, the engine left with
no request running, and usage counting every token up to each stop.

DeepConf-low (``eta=10``: the threshold is the warm-up's 90th percentile) with
16-token windows stops most later traces on SmolLM2-135M; on GSM8K its three
warm-up traces rarely agree, so sampling goes past the warm-up. The test fails if
no trace of the run was stopped, or if any recorded stop or confidence
contradicts the threshold.
"""

from __future__ import annotations

import pytest

from refinery.engine.backends.openai import OpenAIBackend
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.run import run
from refinery.engine.trace import Trace
from refinery.engine.types import SamplingParams
from refinery.strategies import build
from tests.e2e.solving import gsm8k_tasks
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e

WINDOW, WARMUP, MAX_TOKENS = 16, 3, 128
SPEC = f"deepconf(cot, n=6, warmup={WARMUP}, eta=10.0, window={WINDOW}, batch=3)"
PARAMS = SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS)


def check(trace: Trace, slack: int = 0) -> int:
    """Check one problem's trace against its own threshold; return its stopped traces.

    ``slack``: tokens the usage may count beyond those scored (an upstream may not
    score the end-of-turn token of a stream).
    """
    assert trace.error is None and trace.attempt is not None
    [step] = [e for e in trace.events if e.step == "threshold"]
    threshold = step.data["threshold"]
    assert threshold is not None  # the engine sent the top-k logprobs
    warm, *later = [e for e in trace.events if e.kind == "generation"]
    assert len(warm.completions) == WARMUP
    assert sorted(c.measures["confidence"] for c in warm.completions) == sorted(
        step.data["confidences"])
    assert all("stopped_at" not in c.measures for c in warm.completions)
    stopped = 0
    for c in (c for e in later for c in e.completions):
        m = c.measures
        assert 0 <= c.completion_tokens - m["tokens"] <= slack  # a confidence per token
        if c.finish_reason == "confidence":
            stopped += 1
            assert m["confidence"] < threshold and WINDOW <= m["stopped_at"] < MAX_TOKENS
            assert m["stopped_at"] <= c.completion_tokens  # a delta may hold >1 token
        else:  # never below the threshold over a full window
            assert m["tokens"] < WINDOW or m["confidence"] >= threshold, m
    gens = [c for e in trace.events if e.kind == "generation" for c in e.completions]
    assert trace.usage.completion_tokens == sum(c.completion_tokens for c in gens)
    [select] = [e for e in trace.events if e.step == "select"]
    for r in select.data["records"]:  # a voter's weight is its confidence; no stop votes
        assert r["weight"] in (0.0, r["confidence"])
        assert r["stopped_at"] is None or r["weight"] == 0.0
    return stopped


async def solve(backend, n_tasks: int) -> list[Trace]:
    return await run(build(SPEC), gsm8k_tasks(n_tasks), backend, concurrency=n_tasks,
                     params=PARAMS, loop_detector=CusumLoopDetector(), loop_policy="truncate",
                     on_error="raise", spec=SPEC)


async def test_deepconf_in_process_stops_unconfident_traces(vllm_backend):
    traces = await solve(vllm_backend, 4)
    stopped = sum(check(t) for t in traces)
    drawn = sum(t.attempt.metadata["traces"] for t in traces)
    print(f"in-process: {drawn} traces, {stopped} stopped, answers "
          f"{[t.attempt.answer for t in traces]}, tokens "
          f"{sum(t.usage.completion_tokens for t in traces)}")
    assert stopped >= 1
    # the aborted requests leave the engine
    assert await wait_for(lambda: vllm_backend.num_unfinished_requests() == 0)


async def test_deepconf_through_a_vllm_server(vllm_server):
    backend = OpenAIBackend(DEFAULT_MODEL, vllm_server)
    try:
        traces = await solve(backend, 3)
    finally:
        await backend.aclose()
    stopped = sum(check(t, slack=1) for t in traces)
    print(f"upstream: {stopped} stopped, answers {[t.attempt.answer for t in traces]}")
    assert stopped >= 1
