"""force_thinking's control flow on a scripted backend (one word is one token there)."""

from __future__ import annotations

import pytest

from refinery.engine.backends.base import ContinuationUnsupportedError
from refinery.engine.types import Completion, SamplingParams
from refinery.strategies.cot import CoT
from refinery.strategies.force_thinking import THINK_END, ForceThinking, raw_text
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task

FIRST = "<think>\nTom has 3 + 4 = 7 apples."  # 9 words
MORE = ", then doubles to 14."  # 5 words: the model goes on after the word
ANSWER = "The answer is \\boxed{14}."


def thinking_model(messages, params, i):
    """Stops where it would close its thinking while the tag is a stop string (as vLLM
    drops a stop string), else closes it and answers."""
    if THINK_END not in params.stop:
        return ANSWER if messages[-1].role == "assistant" else f"{FIRST}\n{THINK_END}{ANSWER}"
    return MORE if messages[-1].role == "assistant" else FIRST


async def test_short_thinking_is_extended_with_the_word_until_the_minimum():
    backend = ScriptedBackend([(r".*", thinking_model)])
    attempt = await ForceThinking(CoT(), min_tokens=20).solve(task(), ctx(backend))
    assert attempt.text == ANSWER and attempt.answer == "14"
    assert attempt.metadata["extensions"] == 3 and attempt.metadata["thinking_tokens"] == 24
    assert [THINK_END in c.params.stop for c in backend.calls] == [True] * 4 + [False]
    assert [c.continue_final for c in backend.calls] == [False] + [True] * 4
    assert backend.calls[-1].messages[-1].content == (
        f"{FIRST}\nWait{MORE}\nWait{MORE}\nWait{MORE}{THINK_END}")
    assert attempt.metadata["thinking"] == backend.calls[-1].messages[-1].content
    assert "step by step" in backend.calls[0].messages[-1].content  # the inner's prompt


async def test_thinking_token_budget_bounds_the_extensions_and_each_call():
    backend = ScriptedBackend([(r".*", thinking_model)])
    c = ctx(backend, params=SamplingParams(thinking_token_budget=12))
    attempt = await ForceThinking(min_tokens=100, word="Hmm").solve(task(), c)
    assert attempt.metadata["extensions"] == 1 and attempt.metadata["thinking_tokens"] == 14
    assert [c.params.thinking_token_budget for c in backend.calls] == [12, 3, 0]
    assert backend.calls[-1].messages[-1].content == f"{FIRST}\nHmm{MORE}{THINK_END}"
    assert attempt.answer == "14"


async def test_max_extensions_bounds_the_words_appended():
    backend = ScriptedBackend([(r".*", thinking_model)])
    attempt = await ForceThinking(min_tokens=1000, max_extensions=2).solve(task(), ctx(backend))
    assert attempt.metadata["extensions"] == 2 and len(backend.calls) == 4
    assert ForceThinking.worst_case(ForceThinking.Params(max_extensions=2), []) == 3


async def test_thinking_already_long_enough_is_closed_and_answered():
    backend = ScriptedBackend([(r".*", thinking_model)])
    attempt = await ForceThinking(min_tokens=5).solve(task(), ctx(backend))
    assert attempt.metadata["extensions"] == 0 and attempt.text == ANSWER
    assert backend.calls[-1].messages[-1].content == f"{FIRST}{THINK_END}"


def test_a_split_completion_is_rejoined_without_a_second_start_tag():
    thought = Completion(text="", reasoning="more", prompt_tokens=1, completion_tokens=1,
                         finish_reason="stop")
    assert raw_text(thought) == "<think>more" and raw_text(thought, thinking=True) == "more"


async def test_a_backend_that_cannot_continue_is_refused():
    backend = ScriptedBackend([(r".*", FIRST)], continues_messages=False)
    with pytest.raises(ContinuationUnsupportedError):
        await ForceThinking().solve(task(), ctx(backend))
    assert backend.calls == []
