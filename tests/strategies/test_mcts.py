"""MCTS's control flow on a scripted backend and a scripted step scorer: which leaf UCT
selects, what backpropagation adds up, and where depth, simulations and the budget stop
the search."""

from __future__ import annotations

import pytest

from refinery.engine.errors import BudgetError
from refinery.strategies import build
from refinery.strategies.mcts import MCTS
from refinery.strategies.registry import tool_turn_form
from refinery.strategies.step_search import STEP_END
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task
from tests.strategies.test_step_search import ANSWER, scorer  # noqa: F401 (a fixture)

# The next steps of each partial solution, keyed by its last step (None: the root).
TREE = {None: ["good a", "bad b"], "good a": ["bad a1", "bad a2"],
        "bad b": ["good b1", ANSWER], "bad a1": ["fine a11", "fine a12"]}


def tree_reply(messages, params, i):
    last = messages[-1]
    step = last.content.split(STEP_END)[-2] if last.role == "assistant" else None
    return TREE.get(step, ["fine x", "fine y"])[i]


def answer_when_greedy(messages, params, i):
    """Steps that never finish; the completion (at temperature 0) states the answer."""
    return ANSWER if params.temperature == 0.0 else "fine step"


def simulations(c) -> list[dict]:
    return [e.data for e in c.trace.events if e.step == "search"]


async def test_uct_explores_the_less_visited_child_and_backpropagates_visits(scorer):  # noqa: F811
    c = ctx(ScriptedBackend([(r".*", tree_reply)]))
    attempt = await build('mcts(scorer="table", simulations=3, expansions=2, '
                          'exploration=1.0)').solve(task(), c)
    first, second, third = simulations(c)
    assert (first["chain"], first["children"], first["scores"]) == ([0], [1, 2], [0.9, 0.1])
    assert first["visits"] == [2] and first["means"] == [0.5]
    # a (0.9) beats b (0.1) by far more than b's exploration bonus
    assert (second["chain"], second["children"], second["visits"]) == ([0, 1], [3, 4], [4, 3])
    assert second["means"] == [0.3, 0.3667]  # (0.9 + 0.1 + 0.1 + 0.1) / 4, 1.1 / 3
    # now a's mean (0.37) + sqrt(ln 4 / 3) < b's 0.1 + sqrt(ln 4 / 1): b is explored
    assert third["chain"] == [0, 2] and third["visits"] == [6, 3]
    assert third["means"] == [0.4333, 0.5]  # (1.2 + 0.9 + 0.5) / 6, (0.1 + 0.9 + 0.5) / 3
    assert third["done"] == [1] and third["level"] == 1
    assert attempt.answer == "14" and attempt.text == f"bad b{STEP_END}{ANSWER}"
    assert attempt.metadata == {"steps": 2, "score": 0.5, "finished": 1, "simulations": 3,
                                "nodes": 7}


async def test_without_exploration_the_best_mean_is_exploited_first_child_on_ties(
        scorer):  # noqa: F811
    c = ctx(ScriptedBackend([(r".*", tree_reply)]))
    await build('mcts(scorer="table", simulations=3, expansions=2, exploration=0.0)').solve(
        task(), c)
    assert [s["chain"] for s in simulations(c)] == [[0], [0, 1], [0, 1, 3]]
    assert simulations(c)[2]["scores"] == [0.6, 0.6]


async def test_depth_bounds_the_tree_and_the_most_visited_leaf_is_completed(
        scorer):  # noqa: F811
    backend = ScriptedBackend([(r".*", answer_when_greedy)])
    c = ctx(backend)
    attempt = await build('mcts(scorer="table", simulations=20, expansions=1, '
                          'max_steps=2)').solve(task(), c)
    # depth 2 reached after 2 expansions: nothing is left to expand, 18 simulations unused
    assert [s["chain"] for s in simulations(c)] == [[0], [0, 1]]
    assert [call.n for call in backend.calls] == [1, 1, 1]
    assert backend.calls[-1].params.temperature == 0.0 and backend.calls[-1].continue_final
    assert attempt.text == f"fine step{STEP_END}fine step{STEP_END}{ANSWER}"
    assert attempt.metadata["simulations"] == 2 and attempt.metadata["nodes"] == 3


async def test_simulations_bound_the_calls_to_the_declared_worst_case(scorer):  # noqa: F811
    backend = ScriptedBackend([(r".*", answer_when_greedy)])
    strategy = build('mcts(scorer="table", simulations=3, expansions=2)')
    attempt = await strategy.solve(task(), ctx(backend))
    assert [call.n for call in backend.calls] == [2, 2, 2, 1]  # 3 expansions, 1 completion
    assert len(backend.calls) == MCTS.worst_case(strategy.params, []) == 4
    assert attempt.metadata["simulations"] == 3 and attempt.metadata["nodes"] == 7
    assert MCTS.worst_case(build('mcts(scorer="judge", simulations=4)').params, []) == 17


async def test_a_spent_budget_returns_the_most_visited_partial_path(scorer):  # noqa: F811
    backend = ScriptedBackend([(r".*", ["bad one", "good two"])])
    attempt = await build('mcts(scorer="table", expansions=2)').solve(
        task(), ctx(backend, max_calls=1))
    assert len(backend.calls) == 1 and "budget_exhausted" in attempt.metadata
    assert attempt.text == "good two"  # one visit each: the better mean
    assert attempt.metadata["simulations"] == 1


def test_worst_case_is_checked_and_tool_turns_run_as_cot():
    with pytest.raises(BudgetError):
        build('mcts(scorer="judge", simulations=64, expansions=16)', max_calls=100)
    assert repr(tool_turn_form(build("mcts"))) == "cot(instruction='')"
