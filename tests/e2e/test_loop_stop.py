"""A real looping generation is stopped early by the CUSUM monitor, and the
Context's retry policy recovers with a nudge turn."""

from __future__ import annotations

import json

import pytest

from refinery.engine.context import LOOP_NUDGE, Context
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.types import Message, SamplingParams
from tests.conftest import GSM8K

pytestmark = pytest.mark.e2e
# The labelled set's prompt (scripts/make_loop_set.py); test problem 328 loops greedily.
PROMPT = ("Solve this math problem. Think step by step, then give the final answer "
          "on the last line as 'The answer is <number>.'\n\n{question}")


def looping_prompt() -> list[Message]:
    with open(GSM8K / "test.jsonl", encoding="utf-8") as f:
        row = [json.loads(line) for line in f][328]
    return [Message(role="user", content=PROMPT.format(question=row["question"]))]


async def test_monitor_stops_a_real_loop_early(vllm_backend):
    msgs, params = looping_prompt(), SamplingParams(temperature=0, max_tokens=512)
    [free] = await vllm_backend.generate(msgs, params)
    [watched] = await vllm_backend.generate(msgs, params, stop_rule=CusumLoopDetector())
    assert free.finish_reason == "length" and free.completion_tokens == 512
    assert watched.finish_reason == "loop"
    assert watched.completion_tokens < 0.5 * free.completion_tokens
    # The kept text is the prefix up to the loop's onset.
    assert watched.loop_onset == len(watched.text)
    assert free.text.startswith(watched.text)
    assert vllm_backend.num_unfinished_requests() == 0


async def test_context_retries_a_loop_with_a_nudge(vllm_backend):
    ctx = Context(vllm_backend, params=SamplingParams(temperature=0, max_tokens=512),
                  loop_detector=CusumLoopDetector(), loop_policy="retry")
    gen = await ctx.generate(looping_prompt(), strategy="test")
    kinds = [e.step for e in ctx.trace.events]
    assert kinds == ["draft", "loop_retry"]
    retry = ctx.trace.events[1]
    assert retry.parents == [ctx.trace.events[0].id]
    assert retry.data["nudge"] == LOOP_NUDGE
    assert gen[0] is retry.completions[0]
    assert ctx.spent.calls == 2
