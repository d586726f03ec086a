"""CoT, self-consistency and best-of-n control flow."""

from __future__ import annotations

import pytest

from refinery.engine.context import Context
from refinery.engine.errors import SpecError
from refinery.engine.types import Completion, Delta
from refinery.strategies import build
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cot import CoT
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.self_consistency import SelfConsistency
from refinery.verifiers.base import Verdict
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, prompts, task


async def test_cot_streams_only_at_the_root():
    backend = ScriptedBackend([(r".*", "3 + 4 = 7, doubled 14. \\boxed{14}")])
    pieces: list[str] = []

    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)

    root = ctx(backend, final_sink=sink)
    attempt = await CoT().solve(task(), root)
    assert attempt.answer == "14" and "".join(pieces) == attempt.text
    pieces.clear()
    await CoT().solve(task(), root.inner())
    assert pieces == []
    assert "step by step" in backend.calls[0].messages[-1].content


class LogprobBackend(ScriptedBackend):
    """Sample i gets logprob -i; word counts come from the scripted texts."""

    def _completion(self, messages, params, i) -> Completion:
        comp = super()._completion(messages, params, i)
        return comp.model_copy(update={"logprob": -float(i)})


async def test_sc_one_request_and_votes_over_normalised_answers():
    replies = ["so \\boxed{1,000}", "total \\boxed{\\$1000.00}", "\\boxed{999}",
               "The answer is 1000.", "I am not sure how to solve this one", "\\boxed{999}",
               "\\boxed{7}", "\\boxed{1000}"]
    backend = ScriptedBackend([(r".*", replies)])
    attempt = await SelfConsistency(CoT(), n=8).solve(task(), ctx(backend))
    [call] = backend.calls
    assert call.n == 8 and call.params.temperature == 0.7
    assert not call.params.logprobs  # ties go to the first seen: no logprobs needed
    assert attempt.metadata["votes"] == {"1000": 4, "999": 2, "7": 1}
    assert attempt.text == replies[0] and attempt.score == 4 / 8


async def test_sc_tie_goes_to_first_seen_or_to_higher_mean_logprob():
    short, long = "\\boxed{5}", "a b c d e f g h i j k l m n o p q r s \\boxed{6}"
    # sample i has logprob -i: 5 (1 word) at samples 0, 3 -> mean -1.5 per token;
    # 6 (20 words) at samples 1, 2 -> mean -0.075 per token
    backend = LogprobBackend([(r".*", [short, long, long, short])])
    attempt = await SelfConsistency(CoT(), n=4).solve(task(), ctx(backend))
    assert attempt.answer == "5"  # tied 2-2: the default ignores log-probs, 5 came first
    backend = LogprobBackend([(r".*", [short, long, long, short])])
    sc = SelfConsistency(CoT(), n=4, tie_break="logprob")
    attempt = await sc.solve(task(), ctx(backend))
    assert backend.calls[0].params.logprobs
    assert attempt.answer == "6"  # tied 2-2; 6 has the higher per-token log-prob
    plain = ScriptedBackend([(r".*", [long, short, short, long])])
    sc = SelfConsistency(CritiqueRefine(CoT(), rounds=0), n=4, tie_break="logprob")

    def draft(messages, params, i):
        return [long, short, short, long][len(prompts(plain, "step by step")) - 1]
    plain.rules = [(r"strict examiner", "Correctness: 4\nCompleteness: 4\nReasoning validity: "
                    "4\nFormat: 4"), (r"step by step", draft)]
    attempt = await sc.solve(task(), ctx(plain))
    assert len(prompts(plain, "step by step")) == 4  # non-cot inner: n separate runs
    assert attempt.answer == "6"  # no log-probs: first seen wins the 2-2 tie


async def test_best_of_n_judge_keeps_highest_grade():
    samples = ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"]
    grades = {"\\boxed{1}": "meh. Score: 4", "\\boxed{2}": "Score: 9/10", "\\boxed{3}": "garbage"}
    backend = ScriptedBackend([
        (r"grading a solution", lambda m, p, i: next(g for s, g in grades.items()
                                                      if s in m[-1].content)),
        (r".*", samples),
    ])
    attempt = await BestOfN(CoT(), n=3).solve(task(), ctx(backend))
    assert attempt.answer == "2" and attempt.score == 0.9
    judged = prompts(backend, "grading a solution")
    assert len(judged) == 3 and all(c.params.temperature == 0.0 for c in judged)


class FakeVerifier:
    name = "tests"

    async def verify(self, task, answer, gold=None):
        return Verdict.of("\\boxed{3}" in answer)


async def test_best_of_n_uses_the_label_free_verifier():
    backend = ScriptedBackend([(r".*", ["\\boxed{1}", "\\boxed{3}", "\\boxed{3} again"])])
    c = Context(backend, task=task(), verifier=FakeVerifier())
    attempt = await BestOfN(CoT(), n=3).solve(task(), c)
    assert len(backend.calls) == 1  # no judge calls
    assert attempt.text == "\\boxed{3}" and attempt.metadata["scorer"] == "verifier"


# Candidates whose arithmetic the arith step scorer checks: last-step scores 1, 0, 1, 0.5.
STEPPED = ["3 * 4 = 12\n\n12 + 2 = 14\n\nThe answer is \\boxed{14}, as 12 + 2 = 14.",
           "3 * 4 = 12\n\n12 + 2 = 15\n\nThe answer is \\boxed{15}. 15 + 0 = 16",
           "3 * 4 = 12\n\nThe answer is \\boxed{12}. 12 + 0 = 12",
           "I think it is \\boxed{15}."]


async def test_best_of_n_with_a_step_scorer_keeps_the_best_checked_path():
    backend = ScriptedBackend([(r".*", STEPPED)])
    c = ctx(backend)
    attempt = await BestOfN(CoT(), n=4, step_scorer="arith", aggregate="min").solve(task(), c)
    assert len(backend.calls) == 1  # the calculator makes no call
    assert attempt.answer == "14" and attempt.score == 1.0  # first of the two all-right
    scored = [e.data for e in c.trace.events if e.step == "judge"]
    assert [s["steps"] for s in scored] == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0],
                                            [0.5]]
    assert attempt.metadata["step_scores"] == [1.0, 1.0, 1.0]


async def test_weighted_best_of_n_sums_the_scores_of_each_answer():
    # Answer 15 wins by weight (0.5 + 0.5 + 0.5 > 1.0) though 12's one candidate is best.
    samples = ["It is \\boxed{15}.", "It is \\boxed{15}!", "12 + 0 = 12 so \\boxed{12}",
               "Say \\boxed{15}"]
    backend = ScriptedBackend([(r".*", samples)])
    plain = await BestOfN(CoT(), n=4, step_scorer="arith").solve(task(), ctx(backend))
    weighted = await BestOfN(CoT(), n=4, step_scorer="arith", weighted=True).solve(
        task(), ctx(ScriptedBackend([(r".*", samples)])))
    assert (plain.answer, weighted.answer) == ("12", "15")
    assert weighted.text == samples[0]  # the best of 15's candidates, first on a tie


def test_an_unknown_step_scorer_is_refused_when_the_spec_is_built():
    with pytest.raises(SpecError, match="unknown step scorer 'nope'"):
        build('best_of_n(cot, step_scorer="nope")')


async def test_sc_draws_an_inner_that_is_no_sampler_at_its_own_temperature():
    # tir is no Sampler: its n solves run on a view at sc's temperature, so a greedy
    # run (a cascade's first stage, say) still votes over different turns.
    backend = ScriptedBackend([(r".*", "7 + 7 = 14. \\boxed{14}")])
    greedy = ctx(backend)
    greedy = greedy.fork(params=greedy.params.but(temperature=0.0))
    await build("sc(tir, n=2, temperature=0.4)").solve(task(), greedy)
    assert [c.params.temperature for c in backend.calls] == [0.4, 0.4]
