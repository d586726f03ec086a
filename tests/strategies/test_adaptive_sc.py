"""asc: the Beta stopping rule, early stops on agreement, none on a split, aborts."""

from __future__ import annotations

import pytest

from refinery.engine.errors import SpecError
from refinery.strategies import build_with_graph
from refinery.strategies.adaptive_sc import (
    AdaptiveSelfConsistency,
    contest,
    leader_holds,
    votes_needed,
)
from refinery.strategies.cot import CoT
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task


class Samples:
    """Scripted samples in call order: sample j says ``words`` filler words, then
    boxes its answer. Its first word names it (``sa``, ``sb``...: no digit)."""

    def __init__(self, *specs: tuple[str, int]) -> None:
        self.specs = list(specs)
        self.drawn = 0

    def reply(self, messages, params, i) -> str:
        j, self.drawn = self.drawn, self.drawn + 1
        answer, words = self.specs[j]
        return " ".join([f"s{chr(97 + j)}", *["ww"] * words, f"\\boxed{{{answer}}}"])

    def backend(self, **knobs) -> ScriptedBackend:
        return ScriptedBackend([(r".*", self.reply)], watch=True, **knobs)


def asc(**params) -> AdaptiveSelfConsistency:
    return AdaptiveSelfConsistency(CoT(), **params)


def generations(run) -> list:
    return [c for e in run.trace.events if e.kind == "generation" for c in e.completions]


def test_the_posterior_is_a_binomial_tail():
    assert leader_holds(4, 0) == 31 / 32  # 4 of 4 agreeing: above 0.95
    assert leader_holds(3, 1) == 26 / 32
    assert leader_holds(0, 0) == 0.5
    assert leader_holds(6, 1) == pytest.approx(0.9648, abs=1e-4)
    assert leader_holds(5, 5) == 0.5  # a tie is a coin
    assert votes_needed(0, 0, 0.95, 16) == 4 and votes_needed(3, 1, 0.95, 16) == 3
    assert votes_needed(0, 0, 0.95, 2) == 2  # capped
    assert contest([2, 5, 1], "rest") == (5, 3) and contest([2, 5, 1], "runner_up") == (5, 2)
    assert contest([], "rest") == (0, 0)


async def test_four_agreeing_samples_stop_it_without_drawing_more():
    samples = Samples(*[("7", 3)] * 16)
    backend = samples.backend()
    run = ctx(backend)
    attempt = await asc(max_n=16).solve(task(), run)
    assert len(backend.calls) == 4 and all(c.n == 1 for c in backend.calls)
    assert attempt.answer == "7" and attempt.metadata["votes"] == {"7": 4}
    assert attempt.metadata["stopped"] == "confident" and attempt.metadata["aborted"] == 0
    assert attempt.metadata["posterior"] == 0.9688 and attempt.score == 1.0
    assert run.spent.completion_tokens == 4 * 5


async def test_a_split_vote_never_stops_early():
    samples = Samples(*[("1" if j % 2 == 0 else "2", 3) for j in range(8)])
    backend = samples.backend()
    attempt = await asc(max_n=8).solve(task(), ctx(backend))
    assert len(backend.calls) == 8
    assert attempt.metadata["votes"] == {"1": 4, "2": 4}
    assert attempt.metadata["stopped"] == "max_n"
    assert attempt.answer == "1" and attempt.score == 0.5  # a tie: the first seen


async def test_eager_aborts_the_samples_still_running_and_counts_their_tokens():
    samples = Samples(*[("7", 2)] * 4, ("9", 50), ("9", 50))
    backend = samples.backend(paced=True)
    run = ctx(backend)
    attempt = await asc(max_n=16, window=6, eager=True).solve(task(), run)
    assert len(backend.calls) == 6  # all six started at once
    assert attempt.metadata["votes"] == {"7": 4} and attempt.metadata["aborted"] == 2
    comps = generations(run)
    aborted = [c for c in comps if c.finish_reason == "abort"]
    assert len(aborted) == 2 and all(0 < c.completion_tokens < 52 for c in aborted)
    assert all("boxed" not in c.text for c in aborted)
    assert run.spent.completion_tokens == 4 * 4 + sum(c.completion_tokens for c in aborted)


async def test_a_runner_up_that_cannot_catch_up_settles_it():
    samples = Samples(("7", 1), ("7", 1), ("7", 1), ("8", 1), ("8", 1))
    backend = samples.backend()
    attempt = await asc(max_n=5).solve(task(), ctx(backend))
    # 3-1 after four: P = 0.81, but one sample left cannot make it 3-3.
    assert len(backend.calls) == 4 and attempt.metadata["stopped"] == "settled"


async def test_the_runner_up_test_stops_sooner_than_the_rest_test():
    specs = [("7", 1), ("8", 1), ("9", 1), *[("7", 1)] * 13]
    stopped = {}
    for against in ("rest", "runner_up"):
        attempt = await asc(max_n=16, against=against).solve(
            task(), ctx(Samples(*specs).backend()))
        stopped[against] = attempt.metadata["samples"]
    # 7 against 8 and 9 together, or against 8 alone:
    assert stopped == {"rest": 10, "runner_up": 8}  # 8-2 (0.967) and 6-1 (0.965)


async def test_each_vote_is_traced_with_its_posterior():
    samples = Samples(("7", 1), ("8", 1), *[("7", 1)] * 14)
    run = ctx(samples.backend())
    await asc(max_n=16).solve(task(), run)
    votes = [e for e in run.trace.events if e.step == "vote"]
    assert votes and votes[-1].data["votes"] == {"7": 6, "8": 1}
    assert votes[-1].data["posterior"] >= 0.95 > votes[-2].data["posterior"]
    [select] = [e for e in run.trace.events if e.step == "select"]
    assert select.data["stopped"] == "confident" and select.data["samples"] == 7


async def test_the_budget_ends_it_with_the_votes_so_far():
    samples = Samples(*[("7" if j != 1 else "8", 1) for j in range(8)])
    run = ctx(samples.backend(), max_calls=3)
    attempt = await asc(max_n=8).solve(task(), run)
    assert attempt.metadata["stopped"] == "budget" and attempt.metadata["samples"] == 3
    assert attempt.metadata["votes"] == {"7": 2, "8": 1} and attempt.answer == "7"
    assert "budget_exhausted" in attempt.metadata


def test_spec_worst_case_and_params():
    _, g = build_with_graph("asc(cot, max_n=12)")
    assert g.nodes["n0"]["calls"] == 12
    assert build_with_graph("adaptive_sc(re2)")[0].inner[0].name == "re2"
    with pytest.raises(SpecError, match="confidence"):
        build_with_graph("asc(confidence=0.4)")
