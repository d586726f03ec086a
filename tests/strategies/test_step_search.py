"""Step search's control flow (beam, DVTS, particle filtering) on a scripted backend
and a scripted step scorer: what each keeps, prunes and resamples, and the trace."""

from __future__ import annotations

import random

import pytest

from refinery.engine.errors import SpecError
from refinery.strategies import build
from refinery.strategies.particle import softmax, systematic
from refinery.strategies.step_search import STEP_END
from refinery.verifiers.steps import SCORERS, aggregate
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task

ANSWER = "So there are 14 apples. The answer is \\boxed{14}."


class TableScorer:
    """Scores a step by the first word of the table it contains (0.5 otherwise)."""

    name = "table"
    TABLE = {"good": 0.9, "fine": 0.6, "bad": 0.1}

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, ...]]] = []

    async def score(self, task, paths, ctx):
        self.batches.append([tuple(p) for p in paths])
        return [[next((v for k, v in self.TABLE.items() if k in s), 0.5) for s in p]
                for p in paths]


@pytest.fixture
def scorer(monkeypatch) -> TableScorer:
    made = TableScorer()
    monkeypatch.setitem(SCORERS, "table", lambda: made)
    return made


def by_level(*levels):
    """Replies per level (the steps the partial turn already holds), then per sample."""
    def reply(messages, params, i):
        last = messages[-1]
        level = last.content.count(STEP_END) if last.role == "assistant" else 0
        options = levels[min(level, len(levels) - 1)]
        return options[i % len(options)]
    return reply


def levels(c) -> list:
    return [e for e in c.trace.events if e.step == "search"]


async def test_beam_keeps_the_width_best_and_continues_them(scorer):
    backend = ScriptedBackend([(r".*", by_level(
        ["good 3 + 4 = 7.", "bad 3 + 4 = 8.", "fine 7 * 2 = 14.", "bad 7 * 2 = 15."],
        [ANSWER]))])
    c = ctx(backend)
    attempt = await build('beam(scorer="table", width=2, expand=2)').solve(task(), c)
    first, second = levels(c)
    assert (first.data["kept"], first.data["pruned"]) == ([0, 2], [1, 3])
    continued = [call for call in backend.calls if call.continue_final]
    assert len(continued) == 2 and all(call.n == 2 for call in continued)
    partials = sorted(call.messages[-1].content for call in continued)
    assert partials == ["fine 7 * 2 = 14.\n\n", "good 3 + 4 = 7.\n\n"]
    assert attempt.answer == "14" and attempt.text.startswith("good 3 + 4 = 7.")
    assert second.data["done"] == [] and attempt.metadata["finished"] == 4


async def test_dvts_keeps_one_path_per_subtree(scorer):
    children = {"root A": ["good a1", "good a2"], "root B": ["bad b1", "fine b2"]}

    def reply(messages, params, i):
        last = messages[-1]
        if last.role != "assistant":
            return ["root A", "root B"][i]
        if last.content.count(STEP_END) == 1:
            return children[last.content.strip()][i]
        return ANSWER

    c = ctx(ScriptedBackend([(r".*", reply)]))
    await build('dvts(scorer="table", n=4, width=2, max_steps=3)').solve(task(), c)
    _, second, _ = levels(c)
    grown = scorer.batches[1]
    kept = [grown[i][-1] for i in second.data["kept"]]
    # the best of each subtree goes on, though subtree A's runner-up beats B's best
    assert sorted(kept) == ["fine b2", "good a1"]
    assert second.data["scores"] == [0.9, 0.9, 0.1, 0.6]


async def test_particles_resample_by_reward_and_finished_ones_stop(scorer):
    backend = ScriptedBackend([(r".*", by_level(
        ["good 3 + 4 = 7.", "bad 3 + 4 = 9.", "bad 3 + 4 = 6.", "bad 3 + 4 = 5."],
        [ANSWER]))])
    c = ctx(backend)
    attempt = await build('particle(scorer="table", n=4, resample_temperature=0.05)').solve(
        task(), c)
    first, second = levels(c)
    assert first.data["kept"] == [0, 0, 0, 0]  # all four copies of the good particle
    assert [call.n for call in backend.calls] == [4, 1, 1, 1, 1]
    assert second.data["done"] == [0, 1, 2, 3] and len(levels(c)) == 2
    assert attempt.answer == "14"


def test_resampling_follows_the_softmax_of_rewards():
    weights = softmax([1.0, 0.0], 1.0)
    assert weights[0] == pytest.approx(1 / (1 + 2.718281828 ** -1), rel=1e-6)
    draws = systematic([0.75, 0.25], 4, random.Random(3))
    assert sorted(draws) == [0, 0, 0, 1]
    assert softmax([5.0, 0.0], 0.01)[1] < 1e-100


def test_aggregations():
    scores = [0.9, 0.5, 0.8]
    assert [aggregate(scores, h) for h in ("last", "min", "mean")] == [
        0.8, 0.5, pytest.approx(2.2 / 3)]
    assert aggregate(scores, "prod") == pytest.approx(0.36)
    assert aggregate([], "min") == 1.0


async def test_a_spent_budget_returns_the_best_partial_path(scorer):
    backend = ScriptedBackend([(r".*", by_level(["bad one", "good two"], ["never"]))])
    attempt = await build('beam(scorer="table", width=1, expand=2)').solve(
        task(), ctx(backend, max_calls=1))
    assert attempt.text == "good two" and "budget_exhausted" in attempt.metadata


async def test_no_finished_path_gets_its_best_completed(scorer):
    backend = ScriptedBackend([(r".*", by_level(["fine one", "good two"], [ANSWER]))])
    attempt = await build('beam(scorer="table", width=1, expand=2, max_steps=1)').solve(
        task(), ctx(backend))
    assert attempt.text == f"good two{STEP_END}{ANSWER}" and attempt.answer == "14"
    assert backend.calls[-1].params.temperature == 0.0 and not backend.calls[-1].params.stop


def test_an_unknown_scorer_is_a_spec_error():
    with pytest.raises(SpecError, match="step scorer"):
        build('beam(scorer="nope")')
