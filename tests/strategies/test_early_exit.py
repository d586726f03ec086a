"""early_exit's control flow on a scripted backend (one word is one token there), and
votes over a thinking model's samples reading the answer, never the thinking."""

from __future__ import annotations

import math

import pytest

from refinery.engine.early_exit import ANSWER_LEAD, EarlyExitRule
from refinery.engine.types import SamplingParams, TokenLogprob
from refinery.strategies import build
from refinery.strategies.cot import CoT
from refinery.strategies.early_exit import EarlyExit
from refinery.strategies.force_thinking import THINK_END
from refinery.strategies.self_consistency import SelfConsistency
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task

PIECES = ["<think>\nTom has 3 + 4 = 7 apples.",  # 9 words
          " then doubles to 14.",  # 4 words
          " so 14 it is.",  # 4 words
          " checked again, 14."]  # 3 words
ANSWER = "The answer is \\boxed{14}."


def thinking_model(trials: list[str]):
    """Thinks in PIECES, one a call, stopping at each boundary while "Wait" is a stop
    string (as vLLM drops a stop string); a trial after k pieces answers trials[k-1]."""
    def reply(messages, params, i):
        turn = messages[-1].content if messages[-1].role == "assistant" else ""
        if turn.endswith(ANSWER_LEAD):
            return trials[turn.count("\nWait")]
        if turn.endswith(THINK_END):
            return ANSWER
        piece = PIECES[turn.count("\nWait")]
        return piece if "Wait" in params.stop else f"{piece}{THINK_END}{ANSWER}"
    return reply


def sure_of(confident: str):
    """Per-word logprobs: the ``confident`` answer at p=0.99, any other at p=0.5."""
    def tops(text, i):
        p = 0.99 if text == confident else 0.5
        return [[math.log(p)] for _ in text.split()]
    return tops


def trial_calls(backend: ScriptedBackend) -> list:
    return [c for c in backend.calls if c.messages[-1].content.endswith(ANSWER_LEAD)]


async def test_the_thinking_ends_at_the_first_confident_trial_and_not_before():
    backend = ScriptedBackend([(r".*", thinking_model(["7", "14", "14"]))], tops=sure_of("14"))
    c = ctx(backend)
    attempt = await EarlyExit(CoT(), threshold=0.9, repeats=0).solve(task(), c)
    assert attempt.text == ANSWER and attempt.answer == "14"
    assert attempt.metadata["exit"] == "confident" and attempt.metadata["boundaries"] == 2
    assert attempt.metadata["exit_at_tokens"] == attempt.metadata["thinking_tokens"] == 13
    assert attempt.metadata["thinking"] == f"{PIECES[0]}\nWait{PIECES[1]}{THINK_END}"
    assert backend.calls[-1].messages[-1].content == attempt.metadata["thinking"]
    trials = trial_calls(backend)
    assert [t.params.logprobs and t.params.temperature == 0.0 for t in trials] == [True] * 2
    assert [t.params.max_tokens for t in trials] == [16, 16]
    assert trials[0].messages[-1].content == f"{PIECES[0]}{THINK_END}{ANSWER_LEAD}"
    steps = [e for e in c.trace.events if e.step == "threshold"]
    assert [(e.text, e.data["decision"], e.data["at_tokens"]) for e in steps] == [
        ("7", "continue", 9), ("14", "confident", 13)]
    assert [round(e.data["confidence"], 2) for e in steps] == [0.5, 0.99]


async def test_the_same_trial_answer_repeated_ends_the_thinking():
    backend = ScriptedBackend([(r".*", thinking_model(["7", "14", "14"]))], tops=sure_of("-"))
    attempt = await EarlyExit(CoT(), repeats=2).solve(task(), ctx(backend))
    assert attempt.metadata["exit"] == "repeated" and attempt.metadata["boundaries"] == 3
    assert attempt.metadata["exit_at_tokens"] == 17 and attempt.answer == "14"


async def test_no_exit_lets_the_model_think_to_its_end_after_max_trials():
    backend = ScriptedBackend([(r".*", thinking_model(["7", "8", "9", "10"]))],
                              tops=sure_of("-"))
    attempt = await EarlyExit(CoT(), repeats=0, max_trials=3).solve(task(), ctx(backend))
    assert attempt.metadata["exit"] is None and attempt.metadata["exit_at_tokens"] is None
    assert len(trial_calls(backend)) == 3 and "Wait" not in backend.calls[-1].params.stop
    # the free last call counts all its words: what it thought and what it answered
    assert attempt.text == ANSWER and attempt.metadata["thinking_tokens"] == 17 + 6


async def test_thinking_token_budget_closes_the_thinking_at_the_bound():
    backend = ScriptedBackend([(r".*", thinking_model(["7", "8", "9"]))], tops=sure_of("-"))
    c = ctx(backend, params=SamplingParams(thinking_token_budget=12))
    attempt = await EarlyExit(CoT(), repeats=0).solve(task(), c)
    assert [x.params.thinking_token_budget for x in backend.calls
            if x not in trial_calls(backend)] == [12, 3, 0]
    assert len(trial_calls(backend)) == 1 and attempt.answer == "14"
    assert backend.calls[-1].messages[-1].content.endswith(f"{PIECES[1]}{THINK_END}")


async def test_under_sc_each_sample_exits_on_its_own():
    drafts = iter(range(100))

    def reply(messages, params, i):
        turn = messages[-1].content if messages[-1].role == "assistant" else ""
        if not turn:
            return f"<think>\nsample {next(drafts)} thinks."
        if turn.endswith(ANSWER_LEAD):  # odd samples are sure at their second trial
            return "14" if int(turn.split()[2]) % 2 == 0 or "\nWait" in turn else "7"
        return ANSWER if turn.endswith(THINK_END) else " more."

    backend = ScriptedBackend([(r".*", reply)], tops=sure_of("14"))
    attempt = await build("sc(early_exit(cot, repeats=0), n=4)").solve(task(), ctx(backend))
    assert attempt.answer == "14" and len(trial_calls(backend)) == 2 + 2 * 2


async def test_a_vote_reads_the_answers_never_a_boxed_answer_in_the_thinking():
    replies = ["<think>maybe \\boxed{9}</think>The answer is 4.",
               "<think>\\boxed{9} surely</think>So 5.",
               "<think>not \\boxed{9}</think>The answer is 4."]
    backend = ScriptedBackend([(r".*", replies)], reasoning_parser="deepseek_r1")
    attempt = await SelfConsistency(CoT(), n=3).solve(task(), ctx(backend))
    assert attempt.answer == "4" and "9" not in attempt.text


def test_the_rule_refuses_bad_settings():
    with pytest.raises(ValueError, match="threshold"):
        EarlyExitRule(threshold=0.0)
    with pytest.raises(ValueError, match="boundaries"):
        EarlyExitRule(boundaries=("",))
    monitor = EarlyExitRule(threshold=0.9, repeats=0).start()
    assert monitor.observe("  ", [TokenLogprob(token=" ", logprob=0.0)]).exit is None
