"""The split of a completion into parts, with vLLM's own parsers over a real tokenizer
(the embedded model's, with the think and tool-call tags added as tokens)."""

from __future__ import annotations

import pytest

from refinery.engine.completion_parts import Parts, PartsParser
from refinery.engine.errors import InvalidRequestError
from refinery.engine.models import DEFAULT_MODEL, resolve_model
from refinery.engine.tool_calls import Call, Tool

TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
TOOLS = [Tool("add", "Add numbers.", {"type": "object", "properties": {"a": {"type": "number"}}})]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    tok.add_special_tokens({"additional_special_tokens": TAGS})
    return tok


def streamed(parser: PartsParser, tokenizer, text: str, tools=None) -> tuple[Parts, list]:
    """``text`` fed token by token, as an engine streams it; the pieces' parts joined."""
    ids = tokenizer.encode(text)
    stream = parser.stream(tools, tokenizer.encode("<|im_start|>assistant\n"))
    pieces = []
    for i in range(len(ids)):
        piece = tokenizer.decode(ids[:i + 1])[len(tokenizer.decode(ids[:i])):]
        pieces.append(stream.feed(piece, [ids[i]]))
    pieces.append(stream.end())
    reasoning = "".join(p.reasoning for p in pieces) or None
    return Parts(reasoning, "".join(p.text for p in pieces), stream.tool_calls,
                 stream.reasoning_tokens), pieces


@pytest.mark.parametrize("reasoning_parser", ["deepseek_r1", "qwen3"])
def test_thinking_is_split_off_and_a_boxed_answer_in_it_is_not_in_text(tokenizer,
                                                                       reasoning_parser):
    parser = PartsParser(tokenizer, reasoning_parser=reasoning_parser)
    text = "<think>Maybe \\boxed{3}? No.</think>It is \\boxed{4}."
    whole = parser.split(text, tokenizer.encode(text))
    assert whole == Parts("Maybe \\boxed{3}? No.", "It is \\boxed{4}.", None, 10)
    assert streamed(parser, tokenizer, text)[0] == whole


def test_thinking_then_text_then_calls_whole_and_streamed(tokenizer):
    parser = PartsParser(tokenizer, reasoning_parser="qwen3", tool_call_parser="hermes")
    text = "<think>add one</think>Adding. " + CALL
    whole = parser.split(text, tokenizer.encode(text), TOOLS)
    assert whole == Parts("add one", "Adding. ", [Call("add", {"a": 1})], 2)
    joined, pieces = streamed(parser, tokenizer, text, TOOLS)
    assert joined == whole
    call_pieces = [d for p in pieces for d in p.tool_calls or []]
    assert call_pieces[0].name == "add" and call_pieces[0].index == 0
    assert [d.name for d in call_pieces[1:]] == [None] * (len(call_pieces) - 1)
    assert "".join(d.arguments for d in call_pieces) == '{"a": 1}'


def test_two_calls_get_two_indexes(tokenizer):
    parser = PartsParser(tokenizer, tool_call_parser="hermes")
    text = CALL + "\n" + CALL.replace("1", "2")
    whole = parser.split(text, tokenizer.encode(text), TOOLS)
    assert whole == Parts(None, "", [Call("add", {"a": 1}), Call("add", {"a": 2})])
    joined, pieces = streamed(parser, tokenizer, text, TOOLS)
    assert joined.tool_calls == whole.tool_calls
    assert sorted({d.index for p in pieces for d in p.tool_calls or []}) == [0, 1]


def test_without_tools_a_tool_call_parser_leaves_the_answer_alone(tokenizer):
    parser = PartsParser(tokenizer, tool_call_parser="hermes")
    text = "Adding. " + CALL
    assert parser.split(text, tokenizer.encode(text)) == Parts(None, text)
    assert streamed(parser, tokenizer, text)[0] == Parts(None, text)
    # with tools, the Hermes tags must survive detokenization, as vLLM's server keeps them
    assert parser.keeps_special_tokens(TOOLS) and not parser.keeps_special_tokens(None)


def test_no_parser_passes_text_through(tokenizer):
    parser = PartsParser(tokenizer)
    assert not parser.active
    assert parser.split("<think>x</think>y") == Parts(None, "<think>x</think>y")
    assert streamed(parser, tokenizer, "<think>x</think>y")[0] == Parts(None,
                                                                        "<think>x</think>y")


@pytest.mark.parametrize("names", [{"reasoning_parser": "no-such"},
                                   {"tool_call_parser": "no-such"}])
def test_an_unknown_parser_name_lists_the_known_ones(tokenizer, names):
    with pytest.raises(InvalidRequestError, match="no-such'; vLLM knows: .*hermes|deepseek_r1"):
        PartsParser(tokenizer, **names)


def test_a_think_parser_on_a_model_without_think_tokens_is_refused():
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))
    with pytest.raises(InvalidRequestError, match="think start/end tokens"):
        PartsParser(plain, reasoning_parser="deepseek_r1")
