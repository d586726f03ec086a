"""Constrained generation and per-token logprobs through the real vLLM engine."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from pydantic import BaseModel, Field

from refinery.engine.constraints import Constraint
from refinery.engine.errors import InvalidRequestError
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.types import Message, SamplingParams

pytestmark = pytest.mark.e2e


class Sum(BaseModel):
    answer: int
    unit: str = Field(max_length=16)  # bounded, so every sample fits max_tokens


def ask(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


async def test_json_schema_samples_are_all_valid(vllm_backend):
    c = Constraint.from_schema(Sum)
    params = SamplingParams(temperature=0.8, max_tokens=160, constraint=c)
    outs = await asyncio.gather(*(
        vllm_backend.generate(ask(f"{i} apples plus {i} apples? Reply in JSON."), params)
        for i in range(8)))
    texts = [o[0].text for o in outs]
    assert all(o[0].finish_reason == "stop" for o in outs), texts
    assert all(c.accepts(t) for t in texts), texts
    assert all(isinstance(Sum.model_validate_json(t).answer, int) for t in texts)


async def test_json_is_compact_by_default(vllm_backend):
    c = Constraint.from_schema(Sum)
    [out] = await vllm_backend.generate(ask("3+4 apples, as JSON"),
                                        SamplingParams(temperature=0.9, max_tokens=64,
                                                       constraint=c))
    assert c.accepts(out.text)
    assert "\n" not in out.text and ": " not in out.text, out.text


async def test_regex_choice_and_json_object(vllm_backend):
    question = "Is 7 more than 5? What is 7-5?"
    cases = [(Constraint.from_regex(r"The answer is [0-9]{1,3}\."), question),
             (Constraint.one_of(["yes", "no"]), question),
             # any JSON object is unbounded (a sample may open a string it never
             # closes), so its prompt invites a short object and the cap is wider
             (Constraint.any_json(), question + ' Reply as {"difference": N}.')]
    for c, prompt in cases:
        comps = await vllm_backend.generate(ask(prompt),
                                            SamplingParams(temperature=0.7, max_tokens=96,
                                                           n=4, constraint=c))
        done = [x.text for x in comps if x.finish_reason == "stop"]
        assert len(done) >= 1, [x.text for x in comps]
        assert all(c.accepts(t) for t in done), (c.kind, done)


async def test_a_grammar_is_enforced(vllm_backend):
    c = Constraint.from_grammar('root ::= "Score: " [0-5]')
    comps = await vllm_backend.generate(ask("Rate this from 0 to 5."),
                                        SamplingParams(temperature=1.0, max_tokens=8, n=4,
                                                       constraint=c))
    assert all(x.text.startswith("Score: ") and x.text[-1] in "012345" for x in comps), comps


async def test_the_constraint_holds_on_the_monitored_stream_path(vllm_backend):
    c = Constraint.from_regex(r"(yes|no), because [a-z ]{1,40}\.")
    comps = await vllm_backend.generate(ask("Is the sky blue?"),
                                        SamplingParams(temperature=1.0, max_tokens=40, n=3,
                                                       constraint=c),
                                        stop_rule=CusumLoopDetector())
    assert all(c.accepts(x.text) for x in comps if x.finish_reason == "stop"), comps


async def test_a_regex_vllm_cannot_compile_is_a_400(vllm_backend):
    # Python's re accepts a look-behind; vLLM's grammar compiler does not.
    c = Constraint.from_regex(r"(?<=a)b")
    with pytest.raises(InvalidRequestError):
        await vllm_backend.generate(ask("hi"), SamplingParams(max_tokens=4, constraint=c))
    [ok] = await vllm_backend.generate(ask("hi"), SamplingParams(max_tokens=4))
    assert ok.completion_tokens >= 1  # the engine is still serving


async def test_token_logprobs_in_openai_shape(vllm_backend):
    params = SamplingParams(temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    [c] = await vllm_backend.generate(ask("Count: one, two,"), params)
    lps = c.token_logprobs
    assert lps is not None and len(lps) == c.completion_tokens
    assert "".join(t.token for t in lps).startswith(c.text[:5])
    assert math.isclose(sum(t.logprob for t in lps), c.logprob, abs_tol=1e-3)
    for t in lps:
        assert len(t.top_logprobs) == 3
        ranked = [a.logprob for a in t.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        # greedy: the sampled token is the most likely one
        assert t.top_logprobs[0].token == t.token
        assert bytes(t.bytes).decode() == t.token
    json.dumps([t.model_dump() for t in lps])  # finite numbers only


async def test_streamed_logprobs_cover_every_token(vllm_backend):
    params = SamplingParams(temperature=0, max_tokens=10, logprobs=True, top_logprobs=1)
    pieces, last = [], None
    async for d in vllm_backend.stream(ask("Say hello."), params):
        pieces += d.logprobs or []
        last = d
    comp = last.completion
    assert len(pieces) == comp.completion_tokens == len(comp.token_logprobs)
    assert [p.token for p in pieces] == [p.token for p in comp.token_logprobs]
