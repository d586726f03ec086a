"""SSR control flow: decomposition, re-solve confidence, weakest step, fallbacks, variants."""

from __future__ import annotations

import json

from refinery.strategies.cot import CoT
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.strategies.ssr_plan import SSRPlan
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ProbeBackend, ctx, prompts, task

SEED = "3 + 4 = 8 apples, doubled gives 16. \\boxed{16}"
FIXED = "3 + 4 = 7 apples, doubled gives 14. <answer>14</answer>"
STEPS_SEED = [{"description": "How many apples after buying?", "answer": "8"},
              {"description": "How many after doubling?", "answer": "16"}]
STEPS_FIXED = [{"description": "How many apples after buying?", "answer": "7"},
               {"description": "How many after doubling?", "answer": "14"}]


def decomposition(messages, params, i):
    prompt = messages[-1].content
    steps = STEPS_FIXED if "doubled gives 14" in prompt else STEPS_SEED
    return "Here you go:\n```json\n" + json.dumps({"sub-questions": steps}) + "\n```"


def resolve(messages, params, i):
    prompt = messages[-1].content
    if "sub-question: How many apples after buying?" in prompt:
        return ["<answer>7", "<answer>7", "<answer>8", "I think <answer>7", "so 7"][i]
    if "Established so far:\n- How many apples after buying? -> 7" in prompt:
        return "<answer>14"
    return ["<answer>16", "<answer>16", "<answer>16", "<answer>16", "<answer>14"][i]


def rules(decompose=decomposition, judge="Looks right. Score: 5"):
    return [
        (r"Re-evaluate your solution", "<evaluation>I mis-added 3 and 4.</evaluation>\n" + FIXED),
        (r"Feedback on your solution", "Rewritten: 3 + 4 = 7, doubled 14. <answer>14</answer>"),
        (r"rate the solution from 0", judge),
        (r"atomic sub-questions", decompose),
        (r"Answer only this sub-question", resolve),
        (r"step by step", SEED),
    ]


async def test_refines_lowest_confidence_step_with_majority_resolve():
    backend = ProbeBackend(rules())
    attempt = await SSR(CoT(), max_iter=0).solve(task(), ctx(backend))

    [refine] = prompts(backend, "Re-evaluate your solution")
    reflection = refine.messages[-2]
    assert reflection.role == "assistant" and reflection.content.startswith(SEED)
    assert ('in the sub-step "How many apples after buying?" I got 8, but re-checking it, '
            "it should be 7.") in reflection.content
    # new trajectory = text after </evaluation>; answer from the <answer> tag
    assert attempt.text == FIXED and attempt.answer == "14"
    # resolves: one request per step, n=5 at temperature 0.6, all steps in flight at once
    resolves = prompts(backend, "Answer only this sub-question")
    assert [(c.n, c.params.temperature) for c in resolves] == [(5, 0.6)] * 4
    assert backend.peak == 2
    assert all(c.params.temperature == 0.0 for c in prompts(backend, "atomic sub-questions"))
    # the scoring-only round assessed the fixed trajectory: step 1 now 4/5, step 2 5/5
    assert [s["confidence"] for s in attempt.metadata["steps"]] == [0.8, 1.0]
    assert attempt.score == 0.8 and attempt.metadata["rounds"] == 2


async def test_seed_round_confidences_and_weakest():
    backend = ScriptedBackend(rules())
    c = ctx(backend)
    await SSR(CoT(), max_iter=0).solve(task(), c)
    [first, _] = [e for e in c.trace.events if e.kind == "step" and e.step == "resolve"]
    assert first.data["confidences"] == [0.2, 0.8] and first.data["weakest"] == 0


async def test_max_iter_gives_refinements_plus_scoring_round():
    backend = ScriptedBackend(rules())
    attempt = await SSR(CoT(), max_iter=3).solve(task(), ctx(backend))
    assert attempt.metadata["rounds"] == 5  # seed + 4 refinements, each assessed
    assert len(prompts(backend, "atomic sub-questions")) == 5
    refinements = prompts(backend, "Re-evaluate") + prompts(backend, "Feedback on your solution")
    assert len(refinements) == 4


async def test_empty_decomposition_falls_back_to_self_refine():
    backend = ScriptedBackend(rules(decompose='{"sub-questions": []}',
                                    judge="The sum 3+4 is wrong. Score: 1"))
    attempt = await SSR(CoT(), max_iter=0).solve(task(), ctx(backend))
    assert prompts(backend, "Re-evaluate your solution") == []
    assert prompts(backend, "Answer only this sub-question") == []
    [rewrite] = prompts(backend, "Feedback on your solution")
    assert "The sum 3+4 is wrong" in rewrite.messages[-1].content
    assert attempt.answer == "14"
    assert attempt.metadata["mode"] == "self_refine"
    assert attempt.metadata["reason"] == "empty decomposition"


async def test_unparseable_decomposition_retries_once_with_error_then_falls_back():
    backend = ScriptedBackend(rules(decompose="sure! the steps are: add, then double"))
    attempt = await SSR(CoT(), max_iter=0).solve(task(), ctx(backend))
    decomps = prompts(backend, "atomic sub-questions")
    assert len(decomps) == 4  # two assessments x (first try + one retry)
    retry = decomps[1].messages
    assert retry[-1].role == "user" and "could not be read (no JSON object found" in \
        retry[-1].content
    assert len(prompts(backend, "Feedback on your solution")) == 1
    assert attempt.metadata["reason"].startswith("unparseable decomposition")


async def test_full_confidence_falls_back_to_self_refine():
    def agreeing(messages, params, i):
        return "<answer>8" if "after buying?" in messages[-1].content.splitlines()[-2] \
            else "<answer>16"
    backend = ScriptedBackend([(r"Answer only this sub-question", agreeing), *rules()])
    await SSR(CoT(), max_iter=0).solve(task(), ctx(backend))
    assert prompts(backend, "Re-evaluate your solution") == []
    assert len(prompts(backend, "rate the solution from 0")) == 1  # judge, then rewrite
    assert len(prompts(backend, "Feedback on your solution")) == 1


async def test_early_exit_is_off_by_default_and_stops_when_on():
    def agreeing(messages, params, i):
        return "<answer>8" if "after buying?" in messages[-1].content.splitlines()[-2] \
            else "<answer>16"

    def fixed_decomp(messages, params, i):
        return json.dumps({"sub-questions": STEPS_SEED})

    def script():
        return ScriptedBackend([(r"Answer only this sub-question", agreeing),
                                *rules(decompose=fixed_decomp)])
    default, early = script(), script()
    await SSR(CoT(), max_iter=3).solve(task(), ctx(default))
    attempt = await SSR(CoT(), max_iter=3, early_exit=True).solve(task(), ctx(early))
    assert len(prompts(default, "atomic sub-questions")) == 5
    assert len(prompts(early, "atomic sub-questions")) == 2
    assert "early exit" in attempt.metadata["stopped"]


async def test_free_text_sub_answers_use_the_judge_for_agreement():
    steps = [{"description": "Which fruit does Tom buy?", "answer": "a bag of red apples"}]
    backend = ScriptedBackend([
        (r"Candidate answers", "1: same\n2: different\n3: same\n4: same\n5: same"),
        (r"atomic sub-questions", json.dumps({"sub-questions": steps})),
        (r"Answer only this sub-question", "<answer>red apples in a bag"),
        *rules(),
    ])
    c = ctx(backend)
    await SSR(CoT(), max_iter=0).solve(task(), c)
    [first, _] = [e for e in c.trace.events if e.kind == "step" and e.step == "resolve"]
    assert first.data["confidences"] == [0.8]


async def test_ssr_ada_decomposes_only_on_full_marks():
    low = ScriptedBackend(rules(judge="Wrong sum. Score: 2"))
    attempt = await SSRAda(CoT(), max_iter=0).solve(task(), ctx(low))
    assert prompts(low, "atomic sub-questions") == []
    assert len(prompts(low, "rate the solution from 0")) == 2  # one per assessment
    assert len(prompts(low, "Feedback on your solution")) == 1  # judge feedback reused
    assert attempt.metadata["mode"] == "self_refine"

    full = ScriptedBackend(rules(judge="All correct. Score: 5"))
    await SSRAda(CoT(), max_iter=0).solve(task(), ctx(full))
    assert len(prompts(full, "atomic sub-questions")) == 2
    assert len(prompts(full, "Re-evaluate your solution")) == 1


async def test_ssr_plan_replans_below_full_marks_and_seeds_ssr_ada():
    backend = ScriptedBackend([
        (r"Critique the plan", "Step 2 is missing the doubling. Score: 3"),
        (r"Write an improved plan", "1. add the apples 2. double the pile"),
        (r"Summarise the plan", "1. add the apples"),
        (r"Follow this plan", FIXED),
        *rules(judge="fine. Score: 4"),
    ])
    attempt = await SSRPlan(CoT(), max_iter=0).solve(task(), ctx(backend))
    [resolved] = prompts(backend, "Follow this plan")
    assert "1. add the apples 2. double the pile" in resolved.messages[-1].content
    [first_judge, _] = prompts(backend, "rate the solution from 0")
    assert FIXED in first_judge.messages[-1].content  # ssr_ada starts from the re-plan
    assert attempt.answer == "14"


async def test_budget_mid_ssr_returns_last_trajectory():
    backend = ScriptedBackend(rules())
    attempt = await SSR(CoT()).solve(task(), ctx(backend, max_calls=2))
    assert attempt.text == SEED and attempt.answer == "16"
    assert "call budget of 2 spent" in attempt.metadata["budget_exhausted"]
    assert attempt.metadata["stopped"] == "budget"
