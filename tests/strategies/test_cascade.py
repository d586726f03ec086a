"""cascade's control flow on a scripted backend: stop, escalate, reuse, worst case, trace."""

from __future__ import annotations

from collections.abc import Callable

from refinery.engine.types import Message, SamplingParams
from refinery.strategies import build
from refinery.strategies.registry import build_with_graph, tool_turn_form
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task
from tests.strategies.test_pot import NOTHING, RIGHT, fenced


def in_turn(replies: list[str]) -> Callable[[list[Message], SamplingParams, int], str]:
    """Replies in the order samples are drawn, across calls."""
    drawn = iter(replies)
    return lambda messages, params, i: next(drawn)


async def test_a_sure_first_stage_is_kept_and_the_vote_never_runs():
    backend = ScriptedBackend([(r".*", RIGHT)])
    c = ctx(backend)
    attempt = await build("cascade(pot, sc(pot, n=4), until=ran)").solve(task(), c)
    assert [call.n for call in backend.calls] == [1]
    assert attempt.answer == "14" and attempt.strategy == "cascade"
    assert attempt.metadata["stage"] == 1 and attempt.metadata["stopped"] == "sure"
    assert attempt.metadata["checks"] == [{"stage": 1, "signal": "ran", "value": True,
                                           "threshold": None, "sure": True}]
    [check] = [e for e in c.trace.events if e.step == "threshold"]
    assert check.text == ("stage 1 pot: ran: True (needs True); "
                          "stage 2 sc(pot, n=4) not entered")


async def test_an_unsure_first_stage_escalates_and_its_attempt_is_a_vote():
    # pot's program prints nothing (no answer, no vote); the vote draws 3, not 4.
    backend = ScriptedBackend([(r".*", in_turn([NOTHING, RIGHT, RIGHT, fenced("return 9")]))])
    c = ctx(backend)
    attempt = await build("cascade(pot(repairs=0), sc(pot(repairs=0), n=4))").solve(task(), c)
    assert [call.n for call in backend.calls] == [1, 3]
    assert attempt.answer == "14" and attempt.metadata["stage"] == 2
    assert attempt.metadata["votes"] == {"14": 2, "9": 1}
    assert attempt.metadata["candidates"] == 4 and attempt.metadata["stopped"] == "last"
    [check] = attempt.metadata["checks"]
    assert (check["value"], check["sure"]) == (False, False)
    [event] = [e for e in c.trace.events if e.step == "threshold"]
    assert event.text.endswith("stage 2 sc(pot(repairs=0), n=4) entered")


async def test_an_earlier_answer_counts_in_the_later_vote():
    backend = ScriptedBackend([(r".*", in_turn(
        ["The answer is \\boxed{4}.", "The answer is \\boxed{4}.", "The answer is \\boxed{5}."]))])
    spec = "cascade(cot, sc(cot, n=3), until='margin(1)')"  # cot has no vote: unsure
    attempt = await build(spec).solve(task(), ctx(backend))
    assert [call.n for call in backend.calls] == [1, 2]
    assert attempt.metadata["votes"] == {"4": 2, "5": 1}
    assert attempt.metadata["checks"][0]["why"] == "no vote"


async def test_adaptive_consistency_starts_from_the_earlier_answer():
    backend = ScriptedBackend([(r".*", "The answer is \\boxed{4}.")])
    spec = "cascade(cot, asc(cot, max_n=8), until='margin(1)')"
    attempt = await build(spec).solve(task(), ctx(backend))
    # 4 agreeing votes decide at 0.95: the cascade's cot and 3 more
    assert [call.n for call in backend.calls] == [1, 1, 1, 1]
    assert attempt.metadata["votes"] == {"4": 4} and attempt.metadata["samples"] == 4


async def test_a_different_inner_strategy_is_not_reused():
    backend = ScriptedBackend([(r".*", "The answer is \\boxed{4}.")])
    spec = "cascade(cot, sc(re2, n=2), until='margin(1)')"
    attempt = await build(spec).solve(task(), ctx(backend))
    assert [call.n for call in backend.calls] == [1, 2]  # both of re2's samples drawn
    assert attempt.metadata["votes"] == {"4": 2}


async def test_the_last_stage_is_kept_whatever_the_signal_says():
    backend = ScriptedBackend([(r".*", "The answer is \\boxed{4}.")])
    attempt = await build("cascade(cot, cot, until='margin(5)')").solve(task(), ctx(backend))
    assert len(backend.calls) == 2 and attempt.metadata["stage"] == 2
    assert len(attempt.metadata["checks"]) == 1  # the last stage is not read


async def test_a_budget_spent_in_a_later_stage_keeps_the_earlier_attempt():
    backend = ScriptedBackend([(r".*", "The answer is \\boxed{4}.")])
    spec = "cascade(cot, sc(re2, n=2), until='margin(1)')"
    attempt = await build(spec).solve(task(), ctx(backend, max_calls=1))
    assert len(backend.calls) == 1 and attempt.answer == "4"
    assert attempt.metadata["stage"] == 1 and attempt.metadata["stopped"] == "budget"
    assert "budget_exhausted" in attempt.metadata


def test_the_worst_case_is_every_stage():
    _, g = build_with_graph("cascade(pot, sc(pot, n=4), cot)")
    assert g.graph["worst_case_calls"] == 3 + 4 * 3 + 1
    assert [g.nodes[n]["calls"] for n in ("n1", "n2", "n4")] == [3, 12, 1]


def test_a_tool_turn_runs_the_first_stage():
    assert repr(tool_turn_form(build("cascade(cot, sc(cot, n=4))"))) == "cot(instruction='')"
