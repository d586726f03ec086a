"""Structured outputs, logprobs and forced tool calls on the real engine, through
``refinery serve`` (real uvicorn on loopback) and the official ``openai`` SDK.

The model is tiny (SmolLM2-135M): the schemas bound every string and number
(maxLength, minimum/maximum, enum) so that a constrained sample always ends
well inside ``max_tokens``; what is checked is the shape, never the content.
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from refinery.engine.models import DEFAULT_MODEL
from refinery.serving import ServerConfig
from tests.serving.conftest import CountingBackend

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
MODEL = DEFAULT_MODEL
CHAT = "/v1/chat/completions"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30},
                   "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": WEATHER}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
WEATHER_Q = [{"role": "user", "content": "What is the weather like in Paris today?"}]
Q = [{"role": "user", "content": "What is 2+2? Answer briefly."}]


def aclient(url: str) -> openai.AsyncOpenAI:
    # The server shares this event loop: only an async client may talk to it.
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                              timeout=600)


def person_format() -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


class Sum(BaseModel):
    answer: int = Field(ge=0, le=1000)


@pytest.fixture(scope="module")
async def counted(serve, vllm_backend) -> tuple[str, CountingBackend]:
    """A server over a delegate of the real engine that counts model calls."""
    backend = CountingBackend(vllm_backend)
    return await serve(ServerConfig(), backend=backend), backend


async def test_twenty_json_schema_requests_are_all_schema_valid(server_url):
    client = aclient(server_url)

    async def one(i: int):
        return await client.chat.completions.create(
            model=MODEL, max_tokens=160, temperature=0.8, response_format=person_format(),
            messages=[{"role": "user", "content": f"Invent person number {i}: a name, "
                                                  "an age and a city. Reply in JSON."}])

    responses = await asyncio.gather(*(one(i) for i in range(20)))
    for r in responses:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), PERSON)


async def test_regex_and_choice_constraints_match(server_url):
    client = aclient(server_url)
    r = await client.chat.completions.create(
        model=MODEL, messages=Q, max_tokens=16, temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{1,3}"}})
    assert re.fullmatch("[0-9]{1,3}", r.choices[0].message.content)
    r = await client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
        extra_body={"guided_choice": ["yes", "no"]})  # vLLM's older spelling
    assert r.choices[0].message.content in ("yes", "no")
    c = await client.completions.create(model=MODEL, prompt="The capital of France is",
                                        max_tokens=8, temperature=0,
                                        extra_body={"structured_outputs": {
                                            "choice": ["Paris", "Lyon"]}})
    assert c.choices[0].text in ("Paris", "Lyon")


@pytest.mark.parametrize("model", [MODEL, f"sc(cot, n=4)@{MODEL}"])
async def test_sdk_parse_with_a_pydantic_model(server_url, model):
    r = await aclient(server_url).chat.completions.parse(
        model=model, messages=Q, max_tokens=128, response_format=Sum)
    message = r.choices[0].message
    assert isinstance(message.parsed, Sum)
    assert Sum.model_validate_json(message.content) == message.parsed
    if "@" in model:
        ext = r.model_extra["refinery"]
        # sc over cot: one parallel-sampling call (plus any loop retry), then the shaping one.
        assert ext["calls"] >= 2
        assert message.model_extra.get("reasoning_content")


async def test_a_strategy_streams_its_steps_as_reasoning_and_the_shaped_answer_as_content(
        server_url):
    schema = Sum.model_json_schema()
    body = {"model": f"sc(cot, n=2)@{MODEL}", "messages": Q, "max_tokens": 96,
            "stream": True, "response_format": {
                "type": "json_schema", "json_schema": {"name": "sum", "schema": schema}}}
    async with httpx.AsyncClient(timeout=600) as h:
        r = await h.post(server_url + CHAT, json=body)
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]
              if json.loads(e).get("choices")]
    assert "".join(d.get("reasoning_content") or "" for d in deltas)
    jsonschema.validate(json.loads("".join(d.get("content") or "" for d in deltas)), schema)


async def test_top_logprobs_come_back_in_openai_shape(server_url):
    client = aclient(server_url)
    r = await client.chat.completions.create(model=MODEL, messages=Q, max_tokens=8,
                                             temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    # The content's tokens, then (as vLLM's server reports it) the end token, if any.
    assert "".join(t.token for t in content).startswith(r.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0 and isinstance(t.bytes, list)
        assert len(t.top_logprobs) == 3
        assert [a.logprob for a in t.top_logprobs] == sorted(
            (a.logprob for a in t.top_logprobs), reverse=True)
    c = await client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=6,
                                        temperature=0, logprobs=2)
    lp = c.choices[0].logprobs
    n = c.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(2 <= len(top) <= 3 for top in lp.top_logprobs)  # top 2, + the sampled one


async def test_streamed_chat_chunks_carry_logprobs(server_url):
    stream = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=Q, max_tokens=8, temperature=0, logprobs=True,
        top_logprobs=1, stream=True)
    tokens = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            tokens += [t.token for t in chunk.choices[0].logprobs.content]
    assert tokens


async def test_named_tool_choice_returns_valid_tool_calls(server_url):
    client = aclient(server_url)
    r = await client.chat.completions.create(model=MODEL, messages=WEATHER_Q, tools=TOOLS,
                                             tool_choice=NAMED, max_tokens=96)
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    # Streamed: the arguments arrive as deltas of one call.
    stream = await client.chat.completions.create(model=MODEL, messages=WEATHER_Q,
                                                  tools=TOOLS, tool_choice=NAMED,
                                                  max_tokens=96, stream=True)
    pieces, names = [], []
    async for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            names += [tc.function.name] if tc.function.name else []
            pieces.append(tc.function.arguments or "")
    assert names == ["get_weather"]
    jsonschema.validate(json.loads("".join(pieces)), WEATHER)


async def test_required_tool_choice_returns_parsed_calls(server_url):
    r = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=WEATHER_Q, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, max_tokens=128)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


@pytest.mark.parametrize("fields", [
    {"response_format": {"type": "json_schema",
                         "json_schema": {"name": "x", "schema": {"type": "objekt"}}}},
    {"structured_outputs": {"regex": "(unclosed"}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "objekt"}}}], "tool_choice": "auto"},
])
async def test_bad_constraints_are_400_without_an_engine_call(counted, fields):
    url, backend = counted
    before = backend.calls
    async with httpx.AsyncClient(timeout=60) as h:
        for model in (MODEL, f"sc(cot, n=4)@{MODEL}"):
            r = await h.post(url + CHAT, json={"model": model, "messages": Q, **fields})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["type"] == "invalid_request_error"
    assert backend.calls == before
