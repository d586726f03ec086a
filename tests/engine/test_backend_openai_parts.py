"""An OpenAI-compatible upstream's reasoning and tool calls read into a completion's
parts, whole and streamed, from a real HTTP server on loopback."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
from refinery.engine.tool_calls import Call, CallDelta, Tool
from refinery.engine.types import Message, SamplingParams
from tests.engine.test_backend_openai import stream_app
from tests.servers import ThreadedApp

Q = [Message(role="user", content="Add 1.")]
TOOLS = [Tool("add", "Add.", {"type": "object", "properties": {"a": {"type": "number"}}})]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1}'}}


def whole_app(message: dict, bodies: list) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        bodies.append(await request.json())
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", **message}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}})

    return app


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
async def test_a_whole_answer_s_reasoning_and_calls_are_read_and_tools_sent(field):
    bodies: list = []
    message = {"content": "Adding.", field: "add one \\boxed{9}", "tool_calls": [CALL]}
    with ThreadedApp(whole_app(message, bodies)) as url:
        be = OpenAIBackend("m", url)
        [comp] = await be.generate(Q, SamplingParams(max_tokens=9, tools=TOOLS))
        await be.aclose()
    assert (comp.text, comp.reasoning) == ("Adding.", "add one \\boxed{9}")
    assert comp.tool_calls == [Call("add", {"a": 1})]
    assert bodies[0]["tools"] == [{"type": "function", "function": {
        "name": "add", "description": "Add.", "parameters": TOOLS[0].parameters}}]
    assert (be.reasoning_parser, be.tool_call_parser) == (None, None)


async def test_a_plain_answer_has_no_parts_and_sends_no_tools():
    bodies: list = []
    with ThreadedApp(whole_app({"content": "4"}, bodies)) as url:
        be = OpenAIBackend("m", url, config=OpenAIConfig(reasoning_parser="qwen3",
                                                         tool_call_parser="hermes"))
        [comp] = await be.generate(Q, SamplingParams(max_tokens=9))
        await be.aclose()
    assert (comp.text, comp.reasoning, comp.tool_calls) == ("4", None, None)
    assert "tools" not in bodies[0]
    assert (be.reasoning_parser, be.tool_call_parser) == ("qwen3", "hermes")


def event(delta: dict, finish: str | None = None) -> str:
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n"


async def test_a_stream_s_reasoning_text_and_call_pieces_concatenate_to_the_whole():
    events = [event({"role": "assistant", "content": ""}),
              event({"reasoning": "add "}), event({"reasoning_content": "one"}),
              event({"content": "Adding."}),
              event({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "add", "arguments": ""}}]}),
              event({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]}),
              event({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
              event({}, finish="tool_calls"), "data: [DONE]\n\n"]
    with ThreadedApp(stream_app(events)) as url:
        be = OpenAIBackend("m", url)
        deltas = [d async for d in be.stream(Q, SamplingParams(max_tokens=9, tools=TOOLS))]
        await be.aclose()
    shown = deltas[:-1]
    assert [d.reasoning for d in shown if d.reasoning] == ["add ", "one"]
    assert "".join(d.text for d in shown) == "Adding."
    assert [p for d in shown for p in d.tool_calls or []] == [
        CallDelta(0, "add", ""), CallDelta(0, None, '{"a": '), CallDelta(0, None, "1}")]
    comp = deltas[-1].completion
    assert (comp.reasoning, comp.text) == ("add one", "Adding.")
    assert comp.tool_calls == [Call("add", {"a": 1})]
