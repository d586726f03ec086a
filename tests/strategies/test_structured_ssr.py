"""SSR, ssr_ada and ssr_plan in structured mode: each parsed step asks for
its constraint; ``structured=False`` and unsupported backends keep free text."""

from __future__ import annotations

import json
import re

import pytest

from refinery import strategies
from refinery.engine.constraints import StructuredModeError
from refinery.strategies import socratic
from refinery.strategies.cot import CoT
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.strategies.ssr_plan import SSRPlan
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import (
    StrictBackend,
    constraints,
    ctx,
    parse_records,
    prompts,
    task,
)
from tests.strategies.test_ssr import FIXED, SEED, STEPS_FIXED, STEPS_SEED, rules

DECOMPOSE, RESOLVE, AGREE, JUDGE = ("atomic sub-questions", "Answer only this sub-question",
                                    "Candidate answers", "rate the solution from 0")


def compact_decomposition(messages, params, i):
    steps = STEPS_FIXED if "doubled gives 14" in messages[-1].content else STEPS_SEED
    return json.dumps({"sub-questions": steps}, separators=(",", ":"))


def tagged_resolve(messages, params, i):
    prompt = messages[-1].content
    if "sub-question: How many apples after buying?" in prompt:
        value = ["7", "7", "8", "7", "7"][i]
    elif "after buying? -> 7" in prompt:
        value = "14"
    else:
        value = ["16", "16", "16", "16", "14"][i]
    return f"Adding and doubling as asked gives {value}.\n<answer>{value}</answer>"


def structured_rules(judge="The sum 3 + 4 is wrong, so the total is wrong.\nScore: 1"):
    return [
        (r"Re-evaluate your solution", "<evaluation>I mis-added 3 and 4.</evaluation>\n" + FIXED),
        (r"Feedback on your solution", "Rewritten: 3 + 4 = 7, doubled 14. <answer>14</answer>"),
        (JUDGE, judge),
        (DECOMPOSE, compact_decomposition),
        (RESOLVE, tagged_resolve),
        (r"step by step", SEED),
    ]


async def test_structured_ssr_constrains_decomposition_and_resolves():
    backend = StrictBackend(structured_rules())
    c = ctx(backend)
    attempt = await SSR(CoT(), max_iter=0, max_steps=3).solve(task(), c)
    # the draft (the answer) is not a parsed step: no constraint
    assert backend.calls[0].params.constraint is None
    [dec, dec2] = constraints(backend, DECOMPOSE)
    assert dec is dec2 and dec.kind == "json" and dec.name == "decomposition"
    items = dec.json_schema["properties"]["sub-questions"]
    assert dec.json_schema["required"] == ["sub-questions"]
    assert (items["minItems"], items["maxItems"]) == (1, 3)  # maxItems = max_steps
    assert items["items"]["required"] == ["description", "answer"]
    assert not dec.accepts('{"sub-questions":[{"description":"x"}]}')
    assert not dec.accepts(json.dumps({"sub-questions": STEPS_SEED * 2}))  # 4 > max_steps
    # re-solves: brief reasoning without '<', then the tagged value; no stop string
    resolves = prompts(backend, RESOLVE)
    assert {r.params.constraint.regex for r in resolves} == {socratic.RESOLVE_FORM.regex}
    assert all(r.params.stop == [] and r.n == 5 for r in resolves)
    assert socratic.RESOLVE_FORM.accepts("so 7.<answer>7</answer>")
    assert not socratic.RESOLVE_FORM.accepts("7 < 8 <answer>7</answer>")
    assert not socratic.RESOLVE_FORM.accepts("x" * 401 + "<answer>7</answer>")
    # the method still works: weakest step corrected to its majority re-solve
    first = next(e for e in c.trace.events if e.kind == "step" and e.step == "resolve")
    assert first.data["confidences"] == [0.2, 0.8] and first.data["weakest"] == 0
    assert attempt.text == FIXED and attempt.answer == "14"
    assert [s["confidence"] for s in attempt.metadata["steps"]] == [0.8, 1.0]
    records = parse_records(c)
    assert ("ssr", "decompose", [True], True) in records
    assert ("ssr", "resolve", [True] * 5, True) in records
    assert all(r[3] for r in records)


async def test_structured_agreement_check_is_exact_lines():
    steps = [{"description": "Which fruit does Tom buy?", "answer": "a bag of red apples"}]
    backend = StrictBackend([
        (AGREE, "1: same\n2: different\n3: same\n4: same\n5: same"),
        (DECOMPOSE, json.dumps({"sub-questions": steps}, separators=(",", ":"))),
        (RESOLVE, "He buys apples.\n<answer>red apples in a bag</answer>"),
        *structured_rules(),
    ])
    c = ctx(backend)
    await SSR(CoT(), max_iter=0).solve(task(), c)
    [agree, _] = constraints(backend, AGREE)
    assert agree.kind == "regex"
    assert agree.regex == "\n".join(f"{k}: (?:same|different)" for k in range(1, 6))
    assert not agree.accepts("1: same\n2: same")  # one line per candidate, all five
    first = next(e for e in c.trace.events if e.kind == "step" and e.step == "resolve")
    assert first.data["confidences"] == [0.8]
    assert ("ssr", "agree", [True], True) in parse_records(c)


async def test_structured_holistic_judge_ends_in_a_score_line():
    def agreeing(messages, params, i):
        value = "8" if "after buying?" in messages[-1].content.splitlines()[-2] else "16"
        return f"Recomputing: {value}.<answer>{value}</answer>"

    backend = StrictBackend([(RESOLVE, agreeing), *structured_rules()])
    c = ctx(backend)
    attempt = await SSR(CoT(), max_iter=0).solve(task(), c)
    # every step fully confident -> self-refine: the judge, then the rewrite
    [judge] = constraints(backend, JUDGE)
    assert judge.kind == "regex" and judge.regex.endswith(r"\nScore: (?:5|4|3|2|1|0)")
    assert not judge.accepts("Fine.\nScore: 6")
    assert not judge.accepts("Two lines\nof reasons\nScore: 3")  # one paragraph
    [rewrite] = prompts(backend, "Feedback on your solution")
    assert "The sum 3 + 4 is wrong" in rewrite.messages[-1].content
    assert attempt.answer == "14"
    assert ("ssr", "judge", [True], True) in parse_records(c)


async def test_structured_ssr_ada_and_ssr_plan_constrain_their_judges():
    backend = StrictBackend([
        (r"Critique the plan", "Step 2 is missing the doubling.\nScore: 3"),
        (r"Write an improved plan", "1. add the apples 2. double the pile"),
        (r"Summarise the plan", "1. add the apples"),
        (r"Follow this plan", FIXED),
        *structured_rules(judge="Fine.\nScore: 4"),
    ])
    c = ctx(backend)
    attempt = await SSRPlan(CoT(), max_iter=0).solve(task(), c)
    [crit] = constraints(backend, "Critique the plan")
    assert crit.regex == socratic.JUDGE_FORM.regex
    # the plans are not parsed: free text
    assert constraints(backend, "Summarise the plan") == [None]
    assert constraints(backend, "Write an improved plan") == [None]
    assert all(j.regex == socratic.JUDGE_FORM.regex for j in constraints(backend, JUDGE))
    assert attempt.answer == "14"
    records = parse_records(c)
    assert ("ssr_plan", "plan_critique", [True], True) in records
    assert ("ssr_plan", "judge", [True], True) in records


async def test_structured_false_keeps_the_free_text_path():
    backend = ScriptedBackend(rules())
    c = ctx(backend)
    attempt = await SSR(CoT(), max_iter=0, structured=False).solve(task(), c)
    assert all(call.params.constraint is None for call in backend.calls)
    assert all(r.params.stop == ["</answer>"] for r in prompts(backend, RESOLVE))
    assert attempt.text == FIXED and attempt.answer == "14"
    records = parse_records(c)
    assert records and not any(r[3] for r in records)
    # the fenced free-text JSON parses; "so 7" has no tag (its answer is extracted)
    assert ("ssr", "decompose", [True], False) in records
    assert ("ssr", "resolve", [True, True, True, True, False], False) in records


@pytest.mark.parametrize("supported", [frozenset(), frozenset({"json", "json_object"})])
async def test_default_takes_the_free_path_without_every_needed_kind(supported):
    backend = ScriptedBackend(rules(judge="Wrong sum. Score: 2"), structured_outputs=supported)
    attempt = await SSRAda(CoT(), max_iter=0).solve(task(), ctx(backend))
    assert backend.calls and all(call.params.constraint is None for call in backend.calls)
    assert attempt.answer == "14"


async def test_structured_true_without_support_fails_first_naming_what_is_missing():
    backend = ScriptedBackend(rules(), structured_outputs=frozenset({"json"}))
    with pytest.raises(StructuredModeError, match=re.escape(
            "ssr(structured=True) needs 'regex' constraints, which the ScriptedBackend "
            "backend cannot enforce (it supports: json)")) as info:
        await SSR(CoT(), structured=True).solve(task(), ctx(backend))
    assert info.value.code == "unsupported_constraint" and info.value.status == 400
    assert backend.calls == []  # refused before any call
    none = ScriptedBackend(rules(), structured_outputs=frozenset())
    with pytest.raises(StructuredModeError, match="ssr_ada.*needs 'json' and 'regex'"):
        await strategies.build("ssr_ada(structured=True)").solve(task(), ctx(none))
