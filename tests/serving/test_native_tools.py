"""Native tool calls over a backend that parses them (a scripted one with a
``tool_call_parser``), with ``enable_auto_tool_choice``: ``"auto"`` sends the tools to
the chat template and answers with the parser's calls (whole, and streamed as
``tool_calls`` deltas) or text; ``"required"`` keeps its constraint; without the switch
``"auto"`` is refused as vLLM refuses it; earlier calls and results are real turns."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI

from refinery.engine.tool_calls import Call, Tool
from refinery.engine.types import Message
from refinery.serving import ServerConfig
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    MODEL,
    PartsBackend,
    assert_openai_error,
    chat,
    scripted,
    sse_data,
)

pytestmark = pytest.mark.timeout(60)
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                           "description": "Weather of a city.",
                                           "parameters": WEATHER}}]
CALL = Call("get_weather", {"city": "Paris"})
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def native(**knobs) -> PartsBackend:
    return PartsBackend(scripted(), calls=[CALL], when="weather", tool_call_parser="hermes",
                        **knobs)


@pytest.fixture
async def served(scripted_serve):
    backend = native()
    url, _ = await scripted_serve(ServerConfig(enable_auto_tool_choice=True, store=None),
                                  backend=backend)
    return url, backend


async def test_auto_answers_with_the_parsers_calls_and_the_tools_in_the_template(
        served, client):
    url, backend = served
    out = (await client.post(url + CHAT, json=chat(messages=ASK, tools=TOOLS))).json()
    [choice] = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    [sent] = backend.inner.calls
    assert sent.params.tools == [Tool("get_weather", "Weather of a city.", WEATHER)]
    assert sent.params.constraint is None  # the model's own choice, not the envelope
    assert [(m.role, m.content) for m in sent.messages] == [("user", ASK[0]["content"])]


async def test_auto_answers_in_text_when_the_model_calls_nothing(served, client):
    url, _ = served
    out = (await client.post(url + CHAT, json=chat(tools=TOOLS))).json()
    [choice] = out["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == (ANSWER, "stop")
    assert "tool_calls" not in choice["message"]


async def test_native_calls_stream_as_tool_call_deltas(served, client):
    url, _ = served
    r = await client.post(url + CHAT, json=chat(messages=ASK, tools=TOOLS, stream=True))
    choices = [d["choices"][0] for d in sse_data(r.text)[:-1] if d["choices"]]
    pieces = [c for ch in choices for c in ch["delta"].get("tool_calls") or []]
    first, *rest = pieces
    assert first["index"] == 0 and first["id"].startswith("call_")
    assert first["type"] == "function" and first["function"]["name"] == "get_weather"
    assert all("id" not in p and "name" not in p["function"] for p in rest)
    assert "".join(p["function"].get("arguments") or "" for p in pieces) == CALL.arguments_json
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert not any(ch["delta"].get("content") for ch in choices)


async def test_a_streamed_response_makes_the_call_a_function_call_item(served):
    url, _ = served
    api = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    events = [e async for e in await api.responses.create(
        model=MODEL, input=ASK[0]["content"], stream=True, tools=[
            {"type": "function", "name": "get_weather", "parameters": WEATHER}])]
    [item] = events[-1].response.output
    assert (item.type, item.name, json.loads(item.arguments)) == (
        "function_call", "get_weather", {"city": "Paris"})


async def test_required_keeps_its_constraint(served, client):
    url, backend = served
    await client.post(url + CHAT, json=chat(messages=ASK, tools=TOOLS,
                                            tool_choice="required"))
    [sent] = backend.inner.calls
    assert sent.params.constraint is not None and sent.params.tools is None


async def test_auto_without_the_switch_is_refused_as_vllm_refuses_it(scripted_serve, client):
    backend = native()
    url, _ = await scripted_serve(ServerConfig(store=None), backend=backend)
    r = await client.post(url + CHAT, json=chat(messages=ASK, tools=TOOLS))
    assert r.status_code == 400
    err = assert_openai_error(r.json())
    assert err["param"] == "tool_choice" and "--enable-auto-tool-choice" in err["message"]
    assert backend.inner.calls == []


async def test_earlier_calls_and_results_reach_the_backend_as_real_turns(served, client):
    url, backend = served
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."}]
    r = await client.post(url + CHAT, json=chat(messages=history, tools=TOOLS))
    assert r.status_code == 200, r.text
    [sent] = backend.inner.calls
    assert sent.messages[1:] == [
        Message(role="assistant", content="", tool_calls=[CALL]),
        Message(role="tool", content="Sunny, 21 C.", tool_call_id="call_1")]
