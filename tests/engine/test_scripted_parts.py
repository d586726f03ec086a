"""The scripted double returns a completion's parts as a backend with parsers does,
so strategy and server unit tests can use reasoning and native tool calls."""

from __future__ import annotations

from refinery.engine.tool_calls import Call, CallDelta, Tool
from refinery.engine.types import Message, SamplingParams
from tests.scripted_backend import ScriptedBackend

Q = [Message(role="user", content="Add 1.")]
TOOLS = [Tool("add")]
REPLY = '<think>one plus \\boxed{9}</think>Adding. <tool_call>{"name": "add", ' \
        '"arguments": {"a": 1}}</tool_call>'


def parsing(**knobs) -> ScriptedBackend:
    return ScriptedBackend([(r".*", REPLY)], reasoning_parser="deepseek_r1",
                           tool_call_parser="hermes", **knobs)


async def test_whole_reply_is_split_into_thinking_answer_and_calls():
    [comp] = await parsing().generate(Q, SamplingParams(tools=TOOLS))
    assert (comp.reasoning, comp.text) == ("one plus \\boxed{9}", "Adding.")
    assert comp.tool_calls == [Call("add", {"a": 1})] and comp.reasoning_tokens == 3


async def test_without_tools_the_call_stays_text_and_without_parsers_all_is_text():
    [comp] = await parsing().generate(Q, SamplingParams())
    assert comp.tool_calls is None and comp.text.startswith("Adding. <tool_call>")
    [plain] = await ScriptedBackend([(r".*", REPLY)]).generate(Q, SamplingParams(tools=TOOLS))
    assert (plain.text, plain.reasoning, plain.tool_calls) == (REPLY, None, None)


async def test_streamed_parts_concatenate_to_the_whole():
    deltas = [d async for d in parsing().stream(Q, SamplingParams(tools=TOOLS))]
    comp = deltas[-1].completion
    assert "".join(d.reasoning for d in deltas[:-1]) == comp.reasoning
    assert "".join(d.text for d in deltas[:-1]) == comp.text == "Adding."
    assert [p for d in deltas for p in d.tool_calls or []] == [
        CallDelta(0, "add", '{"a": 1}')]


async def test_a_reply_cut_off_while_thinking_is_all_thinking():
    backend = ScriptedBackend([(r".*", "<think>still going")], reasoning_parser="qwen3")
    [comp] = await backend.generate(Q, SamplingParams())
    assert (comp.reasoning, comp.text) == ("still going", "")
