"""Chat requests in the other forms OpenAI accepts, over HTTP on the scripted backend:
``allowed_tools`` narrows the tools offered and is then served as its mode is, the
legacy ``functions`` + ``function_call`` are answered as ``message.function_call``,
image parts are refused (text-only model), and error ``param`` values are written
as OpenAI writes them, never with pydantic's union branch names."""

from __future__ import annotations

import pytest

from tests.serving.conftest import CHAT, MODEL, assert_openai_error, chat, sse_data
from tests.serving.structured_util import constraints, shaped_backend

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
ARGS = '{"city": "Paris"}'
GET_WEATHER = {"name": "get_weather", "description": "Weather of a city.",
               "parameters": WEATHER}
TOOLS = [{"type": "function", "function": GET_WEATHER},
         {"type": "function", "function": {"name": "get_time"}}]


def allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}


@pytest.mark.parametrize("mode", ["auto", "required"])
async def test_allowed_tools_is_its_mode_over_the_allowed_tools_only(scripted_serve, client,
                                                                    mode):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    narrowed = await client.post(url + CHAT, json=chat(
        tools=TOOLS, tool_choice=allowed(mode, "get_weather")))
    plain = await client.post(url + CHAT, json=chat(tools=TOOLS[:1], tool_choice=mode))
    assert narrowed.status_code == plain.status_code
    if plain.status_code != 200:  # refused as the plain mode is (same words, same field)
        assert narrowed.json() == plain.json()
        return
    first, second = backend.calls
    assert first.messages == second.messages
    assert first.params.constraint == second.params.constraint
    assert "get_weather" in first.messages[0].content
    assert "get_time" not in first.messages[0].content


async def test_allowed_tools_naming_an_unknown_tool_is_refused(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(tools=TOOLS,
                                                tool_choice=allowed("auto", "get_news")))
    assert r.status_code == 400
    err = assert_openai_error(r.json())
    assert err["param"] == "tool_choice"
    assert err["message"] == ("allowed_tools names 'get_news', not in tools "
                              "(known: get_weather, get_time)")
    assert backend.calls == []


async def test_legacy_functions_answer_a_function_call(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    legacy = chat(functions=[GET_WEATHER], function_call={"name": "get_weather"})
    r = await client.post(url + CHAT, json=legacy)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["function_call"] == {"name": "get_weather", "arguments": ARGS}
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] is None
    assert choice["finish_reason"] == "stop"  # a forced call, as OpenAI finishes it
    assert constraints(backend)[0].json_schema == WEATHER
    s = await client.post(url + CHAT, json={**legacy, "stream": True})
    deltas = [e["choices"][0]["delta"] for e in sse_data(s.text)[:-1] if e["choices"]]
    calls = [d["function_call"] for d in deltas if "function_call" in d]
    assert calls[0]["name"] == "get_weather" and all("name" not in c for c in calls[1:])
    assert "".join(c["arguments"] for c in calls) == ARGS
    assert not any("tool_calls" in d for d in deltas)


async def test_legacy_turns_are_read_as_tool_calls_and_results(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None,
                 "function_call": {"name": "get_weather", "arguments": ARGS}},
                {"role": "function", "name": "get_weather", "content": "sunny"}]
    r = await client.post(url + CHAT, json=chat(messages=messages, functions=[GET_WEATHER],
                                                function_call="none"))
    assert r.status_code == 200, r.text
    *_, call_turn, result = backend.calls[0].messages
    assert "get_weather" in call_turn.content and "Paris" in call_turn.content
    assert result.role == "user" and "get_weather" in result.content
    assert "sunny" in result.content


@pytest.mark.parametrize(("fields", "param"), [
    ({"functions": [GET_WEATHER], "tools": TOOLS}, "functions"),
    ({"function_call": {"name": "get_weather"}}, "function_call"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]},
     "messages[0].content[1]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools",
                                      "allowed_tools": {"mode": "always", "tools": []}}},
     "tool_choice.allowed_tools.mode"),
])
async def test_refused_forms_name_the_field_as_openai_does(scripted_serve, client, fields,
                                                          param):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(**fields))
    assert r.status_code == 400, r.text
    err = assert_openai_error(r.json())
    assert err["param"] == param
    assert "literal[" not in err["message"] and ".str" not in err["message"]
    assert backend.calls == []


async def test_an_image_part_says_the_model_takes_text_only(scripted_serve, client):
    url, _ = await scripted_serve()
    content = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    r = await client.post(url + CHAT, json=chat(messages=[{"role": "user",
                                                           "content": content}]))
    assert assert_openai_error(r.json())["message"] == (
        "messages[0].content[0]: a part of type image_url: this model takes text only")


async def test_the_sdk_sends_legacy_functions(scripted_serve):
    from openai import AsyncOpenAI

    url, _ = await scripted_serve(backend=shaped_backend(ARGS))
    api = AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    r = await api.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "Weather in Paris?"}], functions=[GET_WEATHER],
        function_call={"name": "get_weather"})
    call = r.choices[0].message.function_call
    assert (call.name, call.arguments) == ("get_weather", ARGS)
