"""The in-process backend splits every completion into parts, against real vLLM.

The embedded model has no think tokens, so the reasoning split needs the small
thinking model (the embedded one with ``<think>``/``</think>`` added and trained),
the session's ``thinking_backend``; its test is skipped until that model is built.
The Hermes tool-call parser reads plain text, so the embedded model's session
engine serves it: a second backend object shares the engine with a parser of its
own (never closed: the engine is the session's).
"""

from __future__ import annotations

import pytest

from refinery.engine.backends.vllm import VLLMBackend, VLLMConfig, chat_turn
from refinery.engine.completion_parts import PartsParser
from refinery.engine.errors import InvalidRequestError
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.tool_calls import Call, Tool, envelope_constraint
from refinery.engine.types import Message, SamplingParams

pytestmark = pytest.mark.e2e

TOOLS = [Tool("add", "Add two numbers.",
              {"type": "object", "properties": {"a": {"type": "integer"}},
               "required": ["a"]})]
ASK = [Message(role="user", content="Add 1 and 2 with the add tool.")]


def hermes_backend(session: VLLMBackend) -> VLLMBackend:
    return VLLMBackend(session.engine, session.tokenizer, session.model,
                       session.max_model_len, session.is_cpu,
                       parts=PartsParser(session.tokenizer, tool_call_parser="hermes"))


def forced_call() -> SamplingParams:
    # The envelope constraint makes the small model write one Hermes call.
    return SamplingParams(temperature=0.0, max_tokens=80, tools=TOOLS,
                          constraint=envelope_constraint(TOOLS, required=True, max_calls=1))


async def test_native_calls_are_parsed_whole_and_streamed_alike(vllm_backend):
    backend = hermes_backend(vllm_backend)
    assert (backend.tool_call_parser, backend.reasoning_parser) == ("hermes", None)
    [whole] = await backend.generate(ASK, forced_call())
    assert whole.tool_calls is not None and [c.name for c in whole.tool_calls] == ["add"]
    assert isinstance(whole.tool_calls[0].arguments["a"], int)
    assert whole.text == "" and whole.reasoning is None
    deltas = [d async for d in backend.stream(ASK, forced_call())]
    final = deltas[-1].completion
    assert final is not None and final.tool_calls == whole.tool_calls
    pieces = [p for d in deltas[:-1] for p in d.tool_calls or []]
    assert pieces[0].name == "add" and {p.index for p in pieces} == {0}
    assert "".join(p.arguments for p in pieces) == whole.tool_calls[0].arguments_json


async def test_without_a_parser_the_call_stays_text(vllm_backend):
    [plain] = await vllm_backend.generate(ASK, forced_call())
    assert plain.tool_calls is None and plain.text.startswith('<tool_call>{"name": "add"')


def test_a_template_with_tools_gets_the_real_turns(vllm_backend):
    call = Call("add", {"a": 1})
    turns = [Message(role="assistant", content="", tool_calls=[call], reasoning="add"),
             Message(role="tool", content="3", tool_call_id="call_0")]
    assert [chat_turn(m, native_tools=True) for m in turns] == [
        {"role": "assistant", "content": "", "reasoning_content": "add",
         "tool_calls": [{"type": "function", "function": {"name": "add",
                                                          "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "3", "tool_call_id": "call_0"}]
    assert chat_turn(turns[1], native_tools=False) == {"role": "tool", "content": "3"}


async def test_an_unknown_parser_is_refused_before_the_engine_starts():
    with pytest.raises(InvalidRequestError, match="unknown tool_call_parser 'nope'.*hermes"):
        await VLLMBackend.create(DEFAULT_MODEL, VLLMConfig(tool_call_parser="nope"))


async def test_a_thinking_model_s_reasoning_is_split_off(thinking_backend):
    backend = thinking_backend
    assert backend.reasoning_parser == "deepseek_r1"
    params = SamplingParams(temperature=0.0, max_tokens=64)
    [whole] = await backend.generate(ASK, params)
    assert whole.reasoning and "<think>" not in whole.text + whole.reasoning
    assert whole.reasoning_tokens is not None and whole.reasoning_tokens > 0
    deltas = [d async for d in backend.stream(ASK, params)]
    assert "".join(d.reasoning for d in deltas) == deltas[-1].completion.reasoning
    assert "".join(d.text for d in deltas) == deltas[-1].completion.text
