"""``/v1/responses`` over HTTP on the scripted backend: the request as the chat request
it means, the answer as a Responses object (a reasoning item under a strategy), the
streamed event sequence (and its end on a failure), tools, formats, refusals."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from refinery.engine.errors import BackendError
from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import ANSWER, MODEL, assert_openai_error, scripted, sse_data
from tests.serving.structured_util import SCHEMA, SOLUTION, constraints, shaped_backend

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
RESPONSES = "/v1/responses"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"]}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
        "parameters": WEATHER}
MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added",
                  "response.output_text.delta", "response.output_text.done",
                  "response.content_part.done", "response.output_item.done"]
STEP_EVENTS = ["response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
               "response.reasoning_summary_text.done", "response.reasoning_summary_part.done"]


def body(**fields) -> dict:
    return {"model": MODEL, "input": "2+2?", **fields}


def events(text: str) -> list[dict]:
    """The JSON events of a Responses stream; checks each SSE ``event:`` names its data's
    type and that the stream ends with ``[DONE]``."""
    data = sse_data(text)
    assert data[-1] == "[DONE]"
    names = [ln[len("event: "):] for ln in text.splitlines() if ln.startswith("event: ")]
    assert names == [d["type"] for d in data[:-1]]
    assert [d["sequence_number"] for d in data[:-1]] == list(range(len(data) - 1))
    return data[:-1]


def collapsed(types: list[str]) -> list[str]:
    """Event types with runs of one delta type written once."""
    return [t for i, t in enumerate(types) if not (t.endswith(".delta") and
                                                    i and types[i - 1] == t)]


async def test_passthrough_answers_a_message_with_the_usage(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + RESPONSES, json=body(instructions="Be brief.",
                                                     max_output_tokens=64))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"].startswith("resp_") and out["object"] == "response"
    assert out["status"] == "completed" and out["store"] is True
    [item] = out["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "output_text", "text": ANSWER, "annotations": []}]
    usage = out["usage"]
    assert usage["output_tokens"] == 4 and usage["output_tokens_details"] == {
        "reasoning_tokens": 0}
    assert usage["total_tokens"] == usage["input_tokens"] + 4
    [call] = backend.calls
    assert [(m.role, m.content) for m in call.messages] == [("system", "Be brief."),
                                                           ("user", "2+2?")]
    assert call.params.max_tokens == 64


async def test_a_strategy_returns_its_steps_as_a_reasoning_item(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + RESPONSES, json=body(model=f"critique_refine@{MODEL}"))
    out = r.json()
    reasoning, message = out["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    steps = [s["text"] for s in reasoning["summary"]]
    assert steps[0] == f"[cot · draft] {ANSWER}"  # the draft critique_refine refines
    assert len(steps) > 2 and all(s.startswith("[critique_refine · ") for s in steps[1:])
    assert message["content"][0]["text"] == ANSWER
    assert out["refinery"]["strategy"].startswith("critique_refine")
    assert out["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


async def test_a_stream_sends_the_event_sequence(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + RESPONSES, json=body(stream=True))
    evs = events(r.text)
    assert collapsed([e["type"] for e in evs]) == [
        "response.created", "response.in_progress", *MESSAGE_EVENTS, "response.completed"]
    assert "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta") \
        == ANSWER
    done = evs[-1]["response"]
    assert done["status"] == "completed" and done["usage"]["output_tokens"] == 4
    assert done["output"][0]["content"][0]["text"] == ANSWER
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["id"] == \
        done["id"]


async def test_a_strategy_streams_its_steps_before_the_answer(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + RESPONSES, json=body(model=f"critique_refine@{MODEL}",
                                                     stream=True))
    types = collapsed([e["type"] for e in events(r.text)])
    steps = (len(types) - 2 - len(MESSAGE_EVENTS) - 1 - 2) // len(STEP_EVENTS)
    assert steps >= 2
    assert types == ["response.created", "response.in_progress",
                     "response.output_item.added", *STEP_EVENTS * steps,
                     "response.output_item.done", *MESSAGE_EVENTS, "response.completed"]


def draft_then_broken(messages, params, i) -> str:
    """The draft is answered; the critique after it finds the upstream broken."""
    if len(messages) > 1 or "critique" in messages[-1].content.lower():
        raise BackendError("upstream broke mid-answer")
    return ANSWER


async def test_a_failure_mid_stream_sends_error_then_response_failed(scripted_serve, client):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r"(?i)critique|review|check",
                                                            draft_then_broken),
                                                           (r".*", ANSWER)]))
    r = await client.post(url + RESPONSES, json=body(model=f"critique_refine@{MODEL}",
                                                     stream=True))
    assert r.status_code == 200  # the stream had begun
    evs = events(r.text)
    assert evs[2]["type"] == "response.output_item.added"  # the draft, as a step
    error, failed = evs[-2:]
    assert error == {"type": "error", "sequence_number": error["sequence_number"],
                     "code": "backend_error", "message": "upstream broke mid-answer"}
    assert failed["type"] == "response.failed"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "backend_error",
                                           "message": "upstream broke mid-answer"}
    assert not any(e["type"] == "response.completed" for e in evs)


async def test_max_output_tokens_cut_is_an_incomplete_response(scripted_serve, client):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", "one two three four")]))
    r = await client.post(url + RESPONSES, json=body(max_output_tokens=2))
    out = r.json()
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert out["output"][0]["status"] == "incomplete"
    s = await client.post(url + RESPONSES, json=body(max_output_tokens=2, stream=True))
    assert events(s.text)[-1]["type"] == "response.incomplete"


async def test_text_format_json_schema_is_the_constraint(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    fmt = {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}
    r = await client.post(url + RESPONSES, json=body(text={"format": fmt}))
    out = r.json()
    assert json.loads(out["output"][0]["content"][0]["text"]) == {"answer": 4}
    assert out["text"]["format"]["schema"] == SCHEMA
    [c] = constraints(backend)
    assert c.json_schema == SCHEMA and c.name == "answer"


async def test_sdk_parse_reads_a_pydantic_model(scripted_serve):
    class Answer(BaseModel):
        answer: int

    url, _ = await scripted_serve(backend=shaped_backend())
    api = AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    parsed = await api.responses.parse(model=MODEL, input="2+2?", text_format=Answer)
    assert parsed.output_parsed == Answer(answer=4)


async def test_a_named_function_tool_is_a_function_call_item(scripted_serve, client):
    args = '{"city": "Paris"}'
    backend = shaped_backend(args)
    url, _ = await scripted_serve(backend=backend)
    choice = {"type": "function", "name": "get_weather"}
    r = await client.post(url + RESPONSES, json=body(tools=[TOOL], tool_choice=choice))
    [item] = r.json()["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert item["arguments"] == args and item["call_id"].startswith("call_")
    assert constraints(backend)[0].json_schema == WEATHER
    s = await client.post(url + RESPONSES, json=body(tools=[TOOL], tool_choice=choice,
                                                     stream=True))
    evs = events(s.text)
    deltas = [e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == args
    [done] = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == args and done["name"] == "get_weather"
    assert evs[-1]["response"]["output"][0]["arguments"] == args


async def test_an_earlier_call_and_its_output_are_read_as_the_conversation(scripted_serve,
                                                                          client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    conversation = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    r = await client.post(url + RESPONSES, json=body(input=conversation))
    assert r.status_code == 200, r.text
    roles = [m.role for m in backend.calls[0].messages]
    assert roles == ["user", "assistant", "user"]
    assert "get_weather" in backend.calls[0].messages[1].content
    assert 'name="get_weather"' in backend.calls[0].messages[2].content
    assert "sunny" in backend.calls[0].messages[2].content


@pytest.mark.parametrize("fields,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": []}, "input"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
])
async def test_bad_requests_are_openai_errors_before_any_engine_call(scripted_serve, client,
                                                                     fields, param):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + RESPONSES, json=body(**fields))
    assert r.status_code == 400, r.text
    assert assert_openai_error(r.json())["param"] == param
    assert backend.calls == []


async def test_an_unknown_response_is_404(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.get(url + RESPONSES + "/resp_123")
    assert r.status_code == 404
    assert assert_openai_error(r.json())["message"] == "Response with id 'resp_123' not found."


async def test_the_sdk_reads_answers_and_streams(scripted_serve):
    url, _ = await scripted_serve(backend=shaped_backend())
    api = AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    r = await api.responses.create(model=f"sc(cot, n=2)@{MODEL}", input="2+2?")
    assert r.output_text == SOLUTION and r.output[0].type == "reasoning"
    stream = await api.responses.create(model=MODEL, input="2+2?", stream=True)
    seen = [ev async for ev in stream]
    assert seen[-1].type == "response.completed"
    assert seen[-1].response.output_text == SOLUTION


async def test_a_function_output_given_as_text_parts_is_read_whole(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    output = [{"type": "input_text", "text": "sunny"}, {"type": "input_text", "text": ", 21 C"}]
    r = await client.post(url + RESPONSES, json=body(input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": output}]))
    assert r.status_code == 200, r.text
    assert "sunny, 21 C" in backend.calls[0].messages[-1].content


@pytest.mark.parametrize("mode", ["auto", "required"])
async def test_allowed_tools_offers_only_the_allowed_ones(scripted_serve, client, mode):
    backend = shaped_backend('{"city": "Paris"}')
    url, _ = await scripted_serve(backend=backend)
    clock = {"type": "function", "name": "get_time"}
    choice = {"type": "allowed_tools", "mode": mode,
              "tools": [{"type": "function", "name": "get_weather"}]}
    narrowed = await client.post(url + RESPONSES, json=body(tools=[TOOL, clock],
                                                            tool_choice=choice))
    plain = await client.post(url + RESPONSES, json=body(tools=[TOOL], tool_choice=mode))
    assert narrowed.status_code == plain.status_code
    if plain.status_code != 200:  # refused as the plain mode is
        assert narrowed.json() == plain.json()
        return
    assert narrowed.json()["tool_choice"] == choice
    first, second = backend.calls
    assert first.messages == second.messages and "get_time" not in first.messages[0].content


@pytest.mark.parametrize("fields,param,says", [
    ({"input": 5}, "input", "input: Input should be a valid string or Input should be a "
                            "valid list"),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://example.com/cat.png"}]}]},
     "input[0].content[1]", "input[0].content[1]: a part of type input_image: this model "
                            "takes text only"),
    ({"input": [{"type": "function_call_output", "call_id": "c",
                 "output": [{"type": "input_image", "file_id": "file_1"}]}]},
     "input[0].output[0]", "this model takes text only"),
    ({"tool_choice": {"type": "allowed_tools", "mode": "always",
                      "tools": [{"type": "function", "name": "get_weather"}]}},
     "tool_choice.mode", "tool_choice.mode: Input should be 'auto' or 'required'"),
    ({"tool_choice": "sometimes"}, "tool_choice", "Input should be 'none', 'auto' or"),
    ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "mode": "auto",
                                       "tools": [{"type": "web_search"}]}},
     "tool_choice.tools[0]", "only function tools with a name can be chosen"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role", "input[0].role: "),
    ({"conversation": "conv_unknown", "previous_response_id": "resp_1"}, "conversation",
     "cannot be used together"),
])
async def test_refusals_name_the_field_as_openai_writes_it(scripted_serve, client, fields,
                                                           param, says):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + RESPONSES, json=body(**fields))
    assert r.status_code == 400, r.text
    err = assert_openai_error(r.json())
    assert err["param"] == param and says in err["message"]
    assert backend.calls == []
