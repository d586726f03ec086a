"""GenSelect's control flow on a scripted backend: the drafts in one request, the one
comparison (constrained to a valid pick where the backend can), the pick parsed from
free text, and the visible fallbacks (no pick, a pick out of range, a spent budget)."""

from __future__ import annotations

import pytest

from refinery.engine.errors import BudgetError
from refinery.engine.types import Attempt
from refinery.strategies import build
from refinery.strategies.genselect import GenSelect, compare_form, parse_pick
from refinery.strategies.registry import tool_turn_form
from refinery.strategies.spec import ChildCost
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import StrictBackend, ctx, prompts, task

DRAFTS = ["3 + 4 = 7, doubled 16. \\boxed{16}", "7, doubled 14. \\boxed{14}",
          "Doubled: 14. \\boxed{14}"]


def backend(comparison: str, cls=ScriptedBackend) -> ScriptedBackend:
    return cls([(r"Compare the drafts", comparison), (r".*", DRAFTS)])


def select_event(c) -> dict:
    [event] = [e for e in c.trace.events if e.step == "select"]
    return event.data


async def test_structured_the_comparison_is_constrained_to_a_valid_pick():
    engine = backend("Draft 3 doubles 7 right.\nBest: 3", StrictBackend)
    c = ctx(engine)
    strategy = build("genselect(n=3)")
    attempt = await strategy.solve(task(), c)
    draft, compare = engine.calls
    assert draft.n == 3 and compare.n == 1 and compare.params.temperature == 0.0
    assert compare.params.constraint.regex.endswith("\\nBest: (?:3|2|1)")
    shown = compare.messages[0].content
    assert all(f"Draft {k}:\n{d}" in shown for k, d in enumerate(DRAFTS, 1))
    assert attempt.text == DRAFTS[2] and attempt.answer == "14"
    assert (attempt.metadata["pick"], attempt.metadata["pick_how"]) == (3, "parsed")
    assert attempt.metadata["draft_answers"] == ["16", "14", "14"]
    assert "fallback" not in attempt.metadata
    assert select_event(c) == {"pick": 3, "how": "parsed", "fallback": None,
                                   "candidates": 3}
    assert len(engine.calls) == GenSelect.worst_case(
        strategy.params, [ChildCost("cot", 1, one_request=True)]) == 2


async def test_free_text_is_parsed_for_its_last_pick_in_range():
    engine = backend("Draft 1 slips at the doubling. Best draft: 2")
    attempt = await build("genselect(n=3, structured=False)").solve(task(), ctx(engine))
    assert engine.calls[1].params.constraint is None
    assert attempt.metadata["pick"] == 2 and attempt.text == DRAFTS[1]


@pytest.mark.parametrize("reply,reason", [
    ("They all look similar.", "no pick in the reply; majority answer"),
    ("Best: 7", "pick 7 out of 1..3; majority answer")])
async def test_an_unreadable_pick_falls_back_to_the_majority_visibly(reply, reason):
    c = ctx(backend(reply))
    attempt = await build("genselect(n=3, structured=False)").solve(task(), c)
    assert attempt.text == DRAFTS[1]  # the first draft of 14, the answer two drafts give
    assert (attempt.metadata["pick_how"], attempt.metadata["fallback"]) == ("fallback", reason)
    assert select_event(c)["fallback"] == reason
    [judge] = [e for e in c.trace.events if e.step == "judge"]
    assert judge.data["parse"] == {"step": "select", "parsed": [False], "structured": False}


def test_ties_and_drafts_without_answers_fall_back_to_the_first():
    tied = [Attempt(text="a", answer="4"), Attempt(text="b", answer="5")]
    assert parse_pick("hmm", tied).reason == "no pick in the reply; majority answer (tied: " \
                                             "first seen)"
    none = [Attempt(text="a"), Attempt(text="b")]
    pick = parse_pick("Best: 0", none)
    assert (pick.index, pick.reason) == (0, "pick 0 out of 1..2; no draft has an answer: "
                                            "the first")
    assert parse_pick("The best is draft #2.", none).index == 1


async def test_a_budget_spent_before_the_comparison_returns_the_majority():
    engine = backend("Best: 1")
    attempt = await build("genselect(n=3)").solve(task(), ctx(engine, max_calls=1))
    assert len(engine.calls) == 1 and prompts(engine, "Compare the drafts") == []
    assert attempt.text == DRAFTS[1] and attempt.metadata["fallback"] == "budget; majority answer"
    assert "budget_exhausted" in attempt.metadata


def test_the_form_the_worst_case_and_tool_turns():
    assert compare_form(3).accepts("Draft 2 is right.\nBest: 2")
    assert not compare_form(3).accepts("Draft 2 is right.\nBest: 4")
    assert not compare_form(3).accepts("two\nlines\nBest: 2")
    with pytest.raises(BudgetError):
        build("genselect(best_of_n(n=8), n=8)", max_calls=40)  # 8 x (1 + 8 judges) + 1
    assert repr(tool_turn_form(build("genselect(sc(n=4))"))) == "sc(cot(instruction=''), n=4)"
