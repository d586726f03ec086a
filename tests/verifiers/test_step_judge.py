"""The judge step scorer: P(Yes) from the first token's alternatives, one judged
call per new step (earlier steps keep their scores), never the gold answer."""

from __future__ import annotations

import pytest

from refinery.engine.types import Completion, TokenLogprob, TopLogprob
from refinery.verifiers.step_judge import JudgeStepScorer, p_yes
from refinery.verifiers.steps import StepScorer, build_scorer
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task


def first_token(token: str, lp: float, *alts: tuple[str, float]) -> Completion:
    tops = [TopLogprob(token=t, logprob=v) for t, v in alts]
    return Completion(text=token, prompt_tokens=1, completion_tokens=1, finish_reason="stop",
                      token_logprobs=[TokenLogprob(token=token, logprob=lp, top_logprobs=tops)])


def test_p_yes_normalises_over_the_two_answers():
    assert p_yes(first_token("Yes", -0.1, ("No", -2.4))) == pytest.approx(
        1 / (1 + 2.718281828 ** (-2.3)), rel=1e-6)
    assert p_yes(first_token(" No", -0.2, ("Yes", -1.0))) < 0.5  # spaces do not matter
    assert p_yes(first_token("Yes", -0.5)) > 0.999  # No not among the top: at most FLOOR
    assert p_yes(first_token("Maybe", -0.5)) == 0.5
    empty = Completion(text="", prompt_tokens=1, completion_tokens=0, finish_reason="stop")
    assert p_yes(empty) == 0.5


async def test_each_new_step_is_judged_once_without_the_gold():
    def reply(messages, params, i):
        return "No" if "3 + 4 = 8" in messages[-1].content.split("Next step:")[1] else "Yes"

    backend = ScriptedBackend([(r".*", reply)])
    scorer, c = build_scorer("judge"), ctx(backend)
    assert isinstance(scorer, JudgeStepScorer) and isinstance(scorer, StepScorer)
    good, bad = "3 + 4 = 7.", "3 + 4 = 8."
    first = await scorer.score(task(), [[good], [good, bad]], c)
    assert len(backend.calls) == 2
    assert first[0][0] > 0.99 and first[1][0] == first[0][0] and first[1][1] < 0.01
    await scorer.score(task(), [[good, bad, "7 * 2 = 14."]], c)
    assert len(backend.calls) == 3  # only the new step went out
    prompt = backend.calls[-1].messages[-1].content
    assert "Solution so far:\n3 + 4 = 7.\n\n3 + 4 = 8." in prompt
    assert all(call.params.constraint is not None and call.params.logprobs
               for call in backend.calls)
