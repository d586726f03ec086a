"""Unit regressions for what the fuzz and hostile tests found (no model needed).

Each case here once crashed (RecursionError, UnicodeEncodeError) or was
silently accepted; the server-level versions live in test_hostile.py.
"""

from __future__ import annotations

import json

import pytest

from refinery.engine.errors import RefineryError, SpecError
from refinery.serving.protocol import ChatCompletionRequest, CompletionRequest, ErrorResponse
from refinery.strategies import build_with_graph


@pytest.mark.parametrize(("spec", "reason"), [
    ("sc(cot, n=" + "-" * 1900 + "1)", "unary operators"),
    ("sc(cot, n=" + "not " * 450 + "1)", "unary operators"),
    ("sc(cot, n=" + "1+" * 900 + "1)", "arithmetic"),
    ("cot\ud800", "surrogate"),
    ("sc(cot, n=2, n=64)", "given more than once"),
    ("sc(" * 200 + "cot" + ")" * 200, "nests deeper than 5 levels (201 levels)"),
])
def test_pathological_specs_are_spec_errors(spec, reason):
    with pytest.raises(SpecError, match=reason.replace("(", r"\(").replace(")", r"\)")) as exc:
        build_with_graph(spec, max_calls=2000)
    assert exc.value.status == 400 and len(exc.value.message) < 400


def test_huge_literal_is_not_echoed_whole():
    with pytest.raises(RefineryError, match="less than or equal to 64") as exc:
        build_with_graph("sc(cot, n=" + "9" * 1900 + ")", max_calls=2000)
    assert len(exc.value.message) < 400


@pytest.mark.parametrize("raw", [
    r'{"model": "m", "messages": [{"role": "user", "content": "a\ud800"}]}',
    r'{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", '
    r'"text": "\udc00"}]}]}',
    r'{"model": "m", "messages": [{"role": "user", "content": "x", "name": "\udfff"}]}',
    r'{"model": "m\ud800", "messages": [{"role": "user", "content": "x"}]}',
    r'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["\ud800"]}',
    r'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
    r'"refinery": {"strategy": "\ud800"}}',
])
def test_lone_surrogates_fail_request_validation(raw):
    with pytest.raises(ValueError, match="lone surrogate"):
        ChatCompletionRequest.model_validate(json.loads(raw))


def test_valid_astral_text_and_completion_prompts_pass():
    text = "\U0001f600 e\u0301 \u202eabc \u0000"
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": text}], "stop": [text]})
    assert req.messages[0].content == text
    with pytest.raises(ValueError, match="lone surrogate"):
        CompletionRequest.model_validate(json.loads(r'{"model": "m", "prompt": ["\udbff"]}'))


def test_error_schema_requires_all_four_keys():
    schema = ErrorResponse.model_json_schema()
    assert schema["$defs"]["ErrorInfo"]["required"] == ["message", "type", "param", "code"]
