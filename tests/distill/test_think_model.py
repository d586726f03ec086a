"""The think model's rows, chat template and registration (the build itself: e2e)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from refinery.distill.schema import ChatMessage, read_rows, write_rows
from refinery.distill.think_model import (
    CHAT_TEMPLATE,
    RECIPE_FILE,
    THINK_MODEL,
    THINK_TOKENS,
    ThinkRecipe,
    arith_think_rows,
    ensure_think_model,
    tool_call_text,
    tool_rows,
    tools_system_prompt,
)
from refinery.distill.train import read_train_record
from refinery.engine.errors import UnknownModelError
from refinery.engine.models import known_models, resolve_model
from refinery.eval.arith import load_arith
from refinery.verifiers.math import extract_answer
from tests.repo_layout import ROOT


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_arith_rows_think_the_gold_steps_then_answer_the_gold():
    examples = load_arith("train", limit=10)
    rows = arith_think_rows(10)
    assert len(rows) == 10
    for ex, row in zip(examples, rows, strict=True):
        user, reply = row.messages
        assert user.content == ex.prompt
        assert reply.reasoning.count("\n") == len(ex.private["steps"])
        assert reply.reasoning.endswith(f"= {ex.gold}.")
        assert extract_answer(reply.content) == ex.gold


def test_tool_rows_answer_by_one_call_of_an_offered_tool_none_of_the_bench():
    bench = (ROOT / "bench" / "tool_calls.py").read_text()
    rows = tool_rows(8)
    names = set()
    for row in rows:
        system, user, reply = row.messages
        call = json.loads(reply.content.removeprefix("<tool_call>\n")
                          .removesuffix("\n</tool_call>"))
        names.add(call["name"])
        assert f'"name": "{call["name"]}"' in system.content
        assert user.content in reply.reasoning
    assert names == {"set_timer", "translate", "get_stock_price", "find_flights"}
    assert not [n for n in names if f'"{n}"' in bench]


def test_template_renders_tools_as_the_rows_system_turn(tokenizer):
    row = tool_rows(1)[0]
    tools = [json.loads(line) for line in row.messages[0].content.split("<tools>\n")[1]
             .split("\n</tools>")[0].splitlines()]
    as_tools = tokenizer.apply_chat_template(
        [{"role": "user", "content": row.messages[1].content}], tools=tools,
        tokenize=False, add_generation_prompt=True)
    as_rows = tokenizer.apply_chat_template(
        [m.model_dump() for m in row.messages[:2]], tokenize=False,
        add_generation_prompt=True)
    assert as_tools == as_rows
    assert tools_system_prompt(tools) == row.messages[0].content


def test_template_renders_reasoning_calls_and_tool_turns(tokenizer):
    text = tokenizer.apply_chat_template([
        {"role": "user", "content": "Set a timer for 5 minutes."},
        {"role": "assistant", "content": "", "reasoning": "A timer. ",
         "tool_calls": [{"type": "function", "function": {
             "name": "set_timer", "arguments": {"minutes": 5}}}]},
        {"role": "tool", "content": "started"},
        {"role": "assistant", "content": "Done."}], tokenize=False)
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nSet a timer for 5 minutes.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nA timer.\n</think>\n\n"
        + tool_call_text("set_timer", {"minutes": 5}) + "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\nstarted\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nDone.<|im_end|>\n")


def test_rows_keep_reasoning_through_jsonl_and_plain_turns_dump_as_before(tmp_path):
    rows = arith_think_rows(3)
    path = tmp_path / "sft.jsonl"
    write_rows(path, rows, "sft")
    assert read_rows(path, "sft") == rows
    assert json.loads(path.read_text().splitlines()[0])["messages"][0] == {
        "role": "user", "content": rows[0].messages[0].content}


@pytest.mark.parametrize("turn, error", [
    (dict(role="user", content="hi", reasoning="x"), "a user turn holds no reasoning"),
    (dict(role="assistant", content="4", reasoning="<think>2+2</think>"), "'<think>'"),
])
def test_reasoning_is_checked_like_content(turn, error):
    with pytest.raises(ValueError, match=error):
        ChatMessage(**turn)


def test_the_think_model_is_registered_and_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REFINERY_HOME", str(tmp_path))
    assert THINK_MODEL in known_models()
    with pytest.raises(UnknownModelError, match="refinery model-path smollm2-135m-think"):
        resolve_model(THINK_MODEL)


@pytest.mark.e2e
async def test_the_built_model_thinks_then_answers_on_arith_test_problems(thinking_backend):
    from refinery.engine.types import Message, SamplingParams

    path = ensure_think_model()  # built: the session's thinking_backend runs it
    tok = AutoTokenizer.from_pretrained(path)
    assert [len(tok(t, add_special_tokens=False)["input_ids"]) for t in THINK_TOKENS] == [1] * 4
    recipe = ThinkRecipe.model_validate_json((path / RECIPE_FILE).read_text())
    assert recipe == ThinkRecipe() and read_train_record(path).config.trainable_tokens
    problems = load_arith("test", limit=5)
    params = SamplingParams(temperature=0.0, max_tokens=160)
    replies = [(await thinking_backend.generate([Message(role="user", content=ex.prompt)],
                                                params))[0] for ex in problems]
    # Measured: all 5 think (the reasoning parser splits it off), then answer boxed.
    shaped = [c for ex, c in zip(problems, replies, strict=True)
              if (c.reasoning or "").strip().startswith(ex.prompt.split()[0] + " starts with")
              and c.text.strip().startswith("The answer is \\boxed{")]
    assert len(shaped) == 5, replies
