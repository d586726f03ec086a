"""Tools over HTTP on the scripted backend: a named tool_choice generates the
arguments under the function's schema, "required" an array of calls, "none"
ignores the tools, "auto" is refused (no tool-call parser); conversations with
earlier tool calls and results are accepted."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.serving.conftest import CHAT, MODEL, assert_openai_error, chat, sse_data
from tests.serving.structured_util import SOLUTION, constraints, shaped_backend

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
ARGS = '{"city": "Paris"}'
CALLS = '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description":
                                           "Weather of a city.", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def tool_chat(**fields) -> dict:
    return chat(tools=TOOLS, **fields)


async def test_named_tool_choice_returns_the_call(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(tool_choice=NAMED))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    msg = choice["message"]
    assert msg["content"] is None
    [call] = msg["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": ARGS}
    [c] = constraints(backend)
    assert c.json_schema == WEATHER and c.name == "get_weather"
    system = backend.calls[0].messages[0]
    assert system.role == "system" and "get_weather: Weather of a city." in system.content
    assert "Call the function get_weather now" in system.content


async def test_named_tool_without_parameters_gets_an_empty_object_schema(scripted_serve,
                                                                        client):
    backend = shaped_backend("{}")
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(
        tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert constraints(backend)[0].json_schema == {"type": "object", "properties": {}}


async def test_named_tool_call_streams_as_argument_deltas(scripted_serve, client):
    url, _ = await scripted_serve(backend=shaped_backend(ARGS))
    r = await client.post(url + CHAT, json=tool_chat(tool_choice=NAMED, stream=True))
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert all("id" not in c and "name" not in c["function"] for c in calls[1:])
    assert len(calls) > 1 and {c["index"] for c in calls} == {0}
    assert "".join(c["function"]["arguments"] for c in calls) == ARGS
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_named_tool_call_under_a_strategy(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(model=f"sc(cot, n=2)@{MODEL}",
                                                     tool_choice=NAMED))
    msg = r.json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["arguments"] == ARGS
    assert msg["reasoning_content"] == SOLUTION
    assert constraints(backend)[-1].json_schema == WEATHER


async def test_required_tool_choice_generates_an_array_of_calls(scripted_serve, client):
    backend = shaped_backend(CALLS)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="required",
                                                     parallel_tool_calls=False))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    schema = constraints(backend)[0].json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [s["properties"]["name"]["enum"] for s in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    # Streamed: the calls are sent whole at the end.
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="required", stream=True))
    events = sse_data(r.text)
    [calls] = [e["choices"][0]["delta"]["tool_calls"] for e in events[:-1]
               if e["choices"] and "tool_calls" in e["choices"][0]["delta"]]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_choice_none_ignores_the_tools(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="none"))
    assert r.json()["choices"][0]["message"]["content"] == SOLUTION
    assert constraints(backend) == [None]
    assert "get_weather" not in backend.calls[0].messages[0].content


@pytest.mark.parametrize(("fields", "needle"), [
    ({"tools": TOOLS}, "tool-call parser"),
    ({"tools": TOOLS, "tool_choice": "auto"}, "tool-call parser"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'nope'"),
    ({"tool_choice": NAMED}, "needs tools"),
    ({"tools": [], "tool_choice": "none"}, "tools"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}},
     "only one output constraint"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "nope"}}}], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "invalid JSON schema"),
])
async def test_tool_requests_refused_before_any_engine_call(scripted_serve, client, fields,
                                                            needle):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(**fields))
    assert r.status_code == 400, r.text
    err = assert_openai_error(r.json(), 400)
    assert err["type"] == "invalid_request_error" and needle in err["message"]
    assert backend.calls == []


async def test_a_conversation_with_tool_calls_and_results_is_accepted(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = await client.post(url + CHAT, json=chat(messages=messages))
    assert r.status_code == 200, r.text
    sent = backend.calls[0].messages
    assert [m.role for m in sent] == ["user", "assistant", "user"]
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}' \
        in sent[1].content
    assert sent[2].content == '<tool_response name="get_weather">\nsunny, 21 C\n</tool_response>'


class Weather(BaseModel):
    city: str


async def test_sdk_named_tool_call_parses(scripted_serve):
    url, _ = await scripted_serve(backend=shaped_backend(ARGS))
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    r = await sdk.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    [call] = r.choices[0].message.tool_calls
    assert call.function.parsed_arguments == Weather(city="Paris")
