"""Drop-in for OptiLLM clients on the real engine: OptiLLM's ``moa-MODEL`` through the
official SDK, reasoning tokens, and vLLM's cached prompt tokens on a repeated prompt."""

from __future__ import annotations

import uuid

import openai
import pytest

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
Q = [{"role": "user", "content": "What is 2+2? Answer briefly."}]


def aclient(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


async def test_moa_prefix_answers_with_reasoning_tokens(server_url):
    r = await aclient(server_url).chat.completions.create(model=f"moa-{MODEL}", messages=Q,
                                                          max_tokens=64)
    assert r.model_extra["refinery"]["strategy"] == "moa(cot)"
    assert r.model_extra["refinery"]["calls"] >= 3  # drafts, critique, synthesis (+ loop retries)
    assert r.choices[0].message.content.strip()
    u = r.usage
    reasoning = u.completion_tokens_details.reasoning_tokens
    assert isinstance(reasoning, int) and 0 < reasoning < u.completion_tokens
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


async def test_passthrough_has_no_reasoning_and_a_repeat_hits_the_prefix_cache(server_url):
    # Long enough to fill several KV blocks; unique, so no earlier test cached it.
    text = f"Request {uuid.uuid4().hex}. " + "Read this carefully and stay calm. " * 60
    messages = [{"role": "system", "content": text}, *Q]
    c = aclient(server_url)
    first = await c.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                            max_tokens=8)
    again = await c.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                            max_tokens=8)
    for r in (first, again):
        assert r.usage.completion_tokens_details.reasoning_tokens == 0
        assert isinstance(r.usage.prompt_tokens_details.cached_tokens, int)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < cached <= again.usage.prompt_tokens
