"""Tools over HTTP on the scripted backend: "auto" (the default) lets the model
choose text or calls in the envelope, "required" closes the text branch, a named
tool_choice generates the arguments under the function's schema, "none" ignores the
tools; calls are bounded, de-duplicated and never returned as text when cut off;
conversations with earlier tool calls and results are accepted."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.serving.conftest import CHAT, MODEL, assert_openai_error, chat, sse_data
from tests.serving.structured_util import CALL, SOLUTION, constraints, shaped_backend

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
ARGS = '{"city": "Paris"}'
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


def tag_format(constraint) -> dict:
    assert constraint.kind == "structural_tag"
    return constraint.structural_tag["format"]


def call_names(fmt: dict) -> list[str]:
    """The function names a repeat-of-tags format admits, in order."""
    return [json.loads(t["begin"].removeprefix("<tool_call>") + "0}")["name"]
            for t in fmt["content"]["elements"]]


@pytest.mark.parametrize("choice", [None, "auto"])
async def test_auto_answers_with_a_call_when_the_model_opens_one(scripted_serve, client,
                                                                choice):
    backend = shaped_backend(tagged=CALL)
    url, _ = await scripted_serve(backend=backend)
    fields = {} if choice is None else {"tool_choice": choice}
    r = await client.post(url + CHAT, json=tool_chat(**fields))
    assert r.status_code == 200, r.text
    choice_ = r.json()["choices"][0]
    assert choice_["finish_reason"] == "tool_calls"
    assert choice_["message"]["content"] is None
    [call] = choice_["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    free, calls = tag_format(constraints(backend)[0])["elements"]
    assert free == {"type": "any_text", "excludes": ["<tool_call>"]}
    assert calls["type"] == "repeat" and (calls["min"], calls["max"]) == (1, 8)
    assert call_names(calls) == ["get_weather", "get_time"]
    assert calls["content"]["elements"][0]["content"]["json_schema"] == WEATHER
    system, shown_ask, shown_call, question = backend.calls[0].messages
    assert "If no function is needed, answer in plain text instead." in system.content
    assert (shown_ask.role, shown_ask.content) == ("user", "Weather of a city.")
    assert (shown_call.role, shown_call.content) == (
        "assistant", '<tool_call>{"name": "get_weather", "arguments": {"city": "example"}}'
        '</tool_call>')
    assert question.role == "user"


async def test_auto_answers_in_text_when_the_model_writes_text(scripted_serve, client):
    url, _ = await scripted_serve(backend=shaped_backend(tagged="It is sunny in Paris."))
    r = await client.post(url + CHAT, json=tool_chat())
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == "It is sunny in Paris."
    assert "tool_calls" not in choice["message"] or not choice["message"]["tool_calls"]


def streamed(events: list) -> tuple[str, list, str]:
    """(content, tool-call deltas, finish reason) of a streamed chat answer."""
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    return content, calls, events[-2]["choices"][0]["finish_reason"]


async def test_auto_streams_a_call_whole_and_text_as_it_comes(scripted_serve, client):
    two = CALL + CALL.replace("Paris", "Rome")
    url, _ = await scripted_serve(backend=shaped_backend(tagged=two))
    r = await client.post(url + CHAT, json=tool_chat(stream=True))
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    content, calls, finish = streamed(events)
    assert content == "" and finish == "tool_calls"
    assert [(c["index"], json.loads(c["function"]["arguments"])["city"]) for c in calls] \
        == [(0, "Paris"), (1, "Rome")]
    text = "It is sunny in Paris today."
    url, _ = await scripted_serve(backend=shaped_backend(tagged=text))
    r = await client.post(url + CHAT, json=tool_chat(stream=True))
    content, calls, finish = streamed(sse_data(r.text))
    assert (content, calls, finish) == (text, [], "stop")
    pieces = [e["choices"][0]["delta"].get("content") for e in sse_data(r.text)[:-1]
              if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(pieces) > 1  # text streams as it comes, not held to the end


async def test_required_never_answers_in_text(scripted_serve, client):
    backend = shaped_backend(tagged="I would rather not call anything.")
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="required"))
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] is None and not msg.get("tool_calls")
    fmt = tag_format(constraints(backend)[0])
    assert fmt["type"] == "repeat" and fmt["min"] == 1  # no text branch
    assert "Call one or more of them now." in backend.calls[0].messages[0].content
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="required", stream=True))
    content, calls, _ = streamed(sse_data(r.text))
    assert (content, calls) == ("", [])


async def test_required_returns_the_calls(scripted_serve, client):
    url, _ = await scripted_serve(backend=shaped_backend(tagged=CALL))
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="required"))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


async def test_calls_are_bounded_and_a_repeated_call_is_one_call(scripted_serve, client):
    written_twice = CALL + "\n" + CALL.replace('{"city": "Paris"}', '{ "city":"Paris" }')
    backend = shaped_backend(tagged=written_twice)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(parallel_tool_calls=False))
    assert len(r.json()["choices"][0]["message"]["tool_calls"]) == 1
    calls = tag_format(constraints(backend)[0])["elements"][1]
    assert (calls["min"], calls["max"]) == (1, 1)


async def test_a_call_cut_off_by_max_tokens_is_never_text(scripted_serve, client):
    url, _ = await scripted_serve(backend=shaped_backend(tagged=CALL))
    for stream in (False, True):
        r = await client.post(url + CHAT, json=tool_chat(max_tokens=2, stream=stream))
        if stream:
            content, calls, finish = streamed(sse_data(r.text))
            assert (content, calls, finish) == ("", [], "length")
        else:
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "length"
            assert choice["message"]["content"] is None
            assert not choice["message"].get("tool_calls")


async def test_a_named_tool_and_a_response_format_in_one_request(scripted_serve, client):
    backend = shaped_backend(ARGS)
    url, _ = await scripted_serve(backend=backend)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": WEATHER}}
    r = await client.post(url + CHAT, json=tool_chat(tool_choice=NAMED, response_format=fmt))
    assert r.status_code == 200, r.text
    [call] = r.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == ARGS
    assert constraints(backend)[0].name == "get_weather"  # the call takes precedence
    # Under "auto", the format shapes the text branch.
    backend = shaped_backend(tagged='{"city": "Oslo"}')
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(response_format=fmt))
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"city": "Oslo"}
    text, _ = tag_format(constraints(backend)[0])["elements"]
    assert text == {"type": "json_schema", "json_schema": WEATHER}


async def test_tool_choice_none_ignores_the_tools(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(tool_choice="none"))
    assert r.json()["choices"][0]["message"]["content"] == SOLUTION
    assert constraints(backend) == [None]
    assert "get_weather" not in backend.calls[0].messages[0].content


@pytest.mark.parametrize(("fields", "needle"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "'nope'"),
    ({"tool_choice": NAMED}, "needs tools"),
    ({"tools": [], "tool_choice": "none"}, "tools"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"},
      "structured_outputs": {"regex": "a+"}}, "only one output constraint"),
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


async def test_sc_votes_equal_calls_written_differently_as_one(scripted_serve, client):
    paris_again = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'
    rome = CALL.replace("Paris", "Rome")
    backend = shaped_backend(tagged=[rome, CALL, paris_again])
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=tool_chat(
        model=f"sc(ssr(cot), n=3)@{MODEL}", refinery={"trace": "full"}))
    body = r.json()
    # ssr cannot act on a tool turn; cot asks for no boxed answer there
    assert body["refinery"]["strategy"] == "sc(cot(instruction=''), n=3)"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    [call_] = backend.calls  # the three samples: one request, under the call's constraint
    assert call_.n == 3 and call_.params.constraint.kind == "structural_tag"
    [vote] = [e for e in body["refinery"]["trace"][0]["events"] if "votes" in e["data"]]
    assert vote["data"]["votes"] == {'tool_call: get_weather{"city":"Rome"}': 1,
                                     'tool_call: get_weather{"city":"Paris"}': 2}
