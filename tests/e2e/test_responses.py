"""The Responses API on the real engine, through ``refinery serve`` (real uvicorn on
loopback) and the official ``openai`` SDK: passthrough and under a strategy, whole and
streamed, ``responses.parse`` with a pydantic model, a named function tool, an effort
level running its strategy, and bad input refused before any engine call."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from pydantic import BaseModel, Field

from refinery.engine.models import DEFAULT_MODEL
from refinery.serving import ServerConfig
from refinery.serving.config import DEFAULT_EFFORT
from tests.serving.conftest import CountingBackend

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
MODEL = DEFAULT_MODEL
Q = "What is 2+2? Answer briefly."
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 30},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather",
        "description": "The current weather of a city.", "parameters": WEATHER}


class Sum(BaseModel):
    answer: int = Field(ge=0, le=1000)


def aclient(url: str) -> openai.AsyncOpenAI:
    # The server shares this event loop: only an async client may talk to it.
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                              timeout=600)


async def streamed(api: openai.AsyncOpenAI, **kw) -> list:
    return [ev async for ev in await api.responses.create(stream=True, **kw)]


async def test_the_official_client_creates_streams_parses_and_calls(server_url):
    api = aclient(server_url)
    greedy = {"input": Q, "temperature": 0, "max_output_tokens": 24}
    plain, chat, strategy, events, parsed, call, high = await asyncio.gather(
        api.responses.create(model=MODEL, **greedy),
        api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": Q}],
                                    temperature=0, max_tokens=24),
        api.responses.create(model=f"sc(cot, n=2)@{MODEL}", input=Q, max_output_tokens=64),
        streamed(api, model=f"sc(cot, n=2)@{MODEL}", input=Q, max_output_tokens=64),
        api.responses.parse(model=MODEL, input=Q, text_format=Sum),
        api.responses.create(model=MODEL, input="What is the weather like in Paris today?",
                             tools=[TOOL], tool_choice={"type": "function",
                                                        "name": "get_weather"}),
        api.responses.create(model=MODEL, input=Q, max_output_tokens=32,
                             reasoning={"effort": "high"}))
    # Passthrough is the chat call the request means: the same greedy text and tokens.
    assert plain.output_text == chat.choices[0].message.content and plain.output_text
    assert plain.usage.output_tokens == chat.usage.completion_tokens
    assert [i.type for i in plain.output] == ["message"]
    # Under a strategy: its steps as a reasoning item, then the answer.
    assert [i.type for i in strategy.output] == ["reasoning", "message"]
    assert strategy.output[0].summary and strategy.output_text
    assert strategy.usage.output_tokens_details.reasoning_tokens > 0
    done = events[-1]
    assert [events[0].type, events[1].type] == ["response.created", "response.in_progress"]
    # An answer cut at max_output_tokens ends the stream as incomplete, saying why.
    if done.type == "response.incomplete":
        assert done.response.incomplete_details.reason == "max_output_tokens"
    else:
        assert done.type == "response.completed" and done.response.status == "completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == done.response.output_text and text
    assert any(e.type == "response.reasoning_summary_text.delta" for e in events)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert isinstance(parsed.output_parsed, Sum)
    [fc] = call.output
    assert fc.type == "function_call" and fc.name == "get_weather"
    assert set(json.loads(fc.arguments)) == {"city", "unit"}
    assert high.model_extra["refinery"]["strategy"] == DEFAULT_EFFORT["high"].spec


@pytest.fixture(scope="module")
async def counted(serve, vllm_backend) -> tuple[str, CountingBackend]:
    backend = CountingBackend(vllm_backend)
    return await serve(ServerConfig(), backend=backend), backend


@pytest.mark.parametrize("fields,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"text": {"format": {"type": "json_schema", "name": "x",
                          "schema": {"type": "objekt"}}}}, "text.format"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
])
async def test_bad_input_is_an_openai_error_without_an_engine_call(counted, fields, param):
    url, backend = counted
    before = backend.calls
    with pytest.raises(openai.BadRequestError) as exc:
        await aclient(url).responses.create(model=MODEL, input=Q, extra_body=fields)
    assert exc.value.status_code == 400 and exc.value.body["param"].startswith(param)
    assert backend.calls == before


async def test_a_previous_response_id_chain_feeds_the_model_every_earlier_turn(server_url):
    api = aclient(server_url)
    greedy = {"model": MODEL, "temperature": 0, "max_output_tokens": 8}
    r1 = await api.responses.create(input="My name is Ada. Say hello.", **greedy)
    r2 = await api.responses.create(input="I live in Lisbon.", previous_response_id=r1.id,
                                    **greedy)
    r3 = await api.responses.create(input="What is my name?", previous_response_id=r2.id,
                                    **greedy)
    # What the server fed the third request: every earlier one, as the one stored chain...
    listed = await api.responses.input_items.list(r3.id, order="asc")
    said = [(i.role, i.content[0].text) for i in listed.data]
    answers = [r1.output_text, r2.output_text]
    assert said == [("user", "My name is Ada. Say hello."), ("assistant", answers[0]),
                    ("user", "I live in Lisbon."), ("assistant", answers[1]),
                    ("user", "What is my name?")]
    # ...so its prompt is the whole conversation's, token for token: the same turns
    # sent explicitly (and not stored) count the same input tokens.
    explicit = await api.responses.create(store=False, input=[
        {"role": role, "content": text} for role, text in said], **greedy)
    assert r3.usage.input_tokens == explicit.usage.input_tokens
    assert r1.usage.input_tokens < r2.usage.input_tokens < r3.usage.input_tokens
    assert r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens
