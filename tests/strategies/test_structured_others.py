"""critique_refine, dei, sage and best_of_n in structured mode: the parsed
step asks for its constraint; ``structured=False`` and unsupported backends keep free
text; ``structured=True`` without support fails before any call."""

from __future__ import annotations

import json

import pytest

from refinery import strategies
from refinery.engine.constraints import StructuredModeError
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cot import CoT
from refinery.strategies.critique_refine import CRITIQUE_FORM, CritiqueRefine
from refinery.strategies.dei import DEI, REVIEW_FORM
from refinery.strategies.sage import SAGE, plan_schema, render_plan
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import (
    StrictBackend,
    constraints,
    ctx,
    parse_records,
    prompts,
    task,
)
from tests.strategies.test_critique_dei_sage import committee, member_reply, rubric

NONE = frozenset()

# ----------------------------------------------------------------------- critique_refine


async def test_structured_critique_is_the_prompted_form():
    backend = StrictBackend([(r"strict examiner", rubric(3, 4, 3, 3, "box the answer")),
                             (r".*", "v1 \\boxed{14}")])
    c = ctx(backend)
    attempt = await CritiqueRefine(CoT(), rounds=2).solve(task(), c)
    [form] = constraints(backend, "strict examiner")
    assert form is CRITIQUE_FORM and form.kind == "regex"
    for label in ("Correctness: [1-4] - ", "Reasoning validity: [1-4] - ", "\\nDirective: "):
        assert label in form.regex
    assert not form.accepts(rubric(5, 4, 3, 3))  # scores are 1-4
    assert not form.accepts("Correctness: 3 - x")  # every part is required
    assert attempt.metadata["rubric"] == {"correctness": 3.0, "completeness": 4.0,
                                          "reasoning validity": 3.0, "format": 3.0}
    assert attempt.metadata["directive"] == "box the answer"
    assert parse_records(c) == [("critique_refine", "critique", [True], True)]


async def test_critique_free_path_and_its_parse_notes():
    backend = ScriptedBackend([(r"strict examiner", "I like it!"), (r".*", "\\boxed{1}")])
    c = ctx(backend)
    attempt = await CritiqueRefine(CoT(), rounds=0, structured=False).solve(task(), c)
    assert all(call.params.constraint is None for call in backend.calls)
    assert set(attempt.metadata["rubric"].values()) == {2.5}
    assert parse_records(c) == [("critique_refine", "critique", [False], False)]
    bare = ScriptedBackend([(r"strict examiner", rubric(3, 3, 3, 3)), (r".*", "\\boxed{1}")],
                           structured_outputs=NONE)
    c = ctx(bare)
    attempt = await CritiqueRefine(CoT(), rounds=0).solve(task(), c)
    assert all(call.params.constraint is None for call in bare.calls)
    assert attempt.metadata["rubric"]["format"] == 3.0
    assert parse_records(c) == [("critique_refine", "critique", [True], False)]


# ----------------------------------------------------------------------------------- dei


def review_paragraphs(grade: int, who: str = "it") -> str:
    return "".join(f"{k}. About {who}: point {k}.\n" for k in range(1, 6)) + f"Score: {grade}"


async def test_structured_dei_reviews_are_five_paragraphs_then_a_grade():
    grades = {"A says": [6, 7, 8], "B says": [9, 9, 9], "C says": [8, 8, 8]}

    def review(messages, params, i):
        who = messages[-1].content.split("Candidate solution:\n")[1][:6]
        return review_paragraphs(grades[who][i], who)

    backend = StrictBackend([(r"review committee", review), (r".*", member_reply)])
    c = ctx(backend)
    attempt = await committee().solve(task(), c)
    forms = constraints(backend, "review committee")
    assert len(forms) == 3 and all(f is REVIEW_FORM for f in forms)
    assert [call.n for call in prompts(backend, "review committee")] == [3, 3, 3]
    assert REVIEW_FORM.regex.startswith(r"1\. [^\n]{1,240}\n2\. ")
    assert REVIEW_FORM.regex.endswith("Score: (?:10|9|8|7|6|5|4|3|2|1)")
    assert not REVIEW_FORM.accepts(review_paragraphs(0))
    assert not REVIEW_FORM.accepts("1. only one paragraph\nScore: 7")
    assert attempt.text == "B says \\boxed{12}" and attempt.metadata["means"] == [7.0, 9.0, 8.0]
    assert parse_records(c) == [("dei", "review", [True] * 3, True)] * 3


async def test_dei_free_path_counts_explicit_grades_only():
    backend = ScriptedBackend([
        (r"review committee", ["Score: 7", "I'd say 9.", "nothing"]), (r".*", member_reply)])
    c = ctx(backend)
    attempt = await DEI(CoT(temperature=0.1), votes=3, structured=False).solve(task(), c)
    assert all(call.params.constraint is None for call in backend.calls)
    assert attempt.metadata["means"] == [7.0]
    assert parse_records(c) == [("dei", "review", [True, False, False], False)]
    bare = ScriptedBackend([(r"review committee", "Score: 7"), (r".*", member_reply)],
                           structured_outputs=NONE)
    await DEI(CoT(temperature=0.1), votes=2).solve(task(), ctx(bare))
    assert all(call.params.constraint is None for call in bare.calls)


# ---------------------------------------------------------------------------------- sage

PLAN = {"goal": "the apples in the end", "known": "3 apples, 4 bought, then doubled",
        "key_steps": ["add the bought apples", "double the pile"],
        "dependencies": "step 2 needs step 1", "pitfalls": "double after adding",
        "lessons": "the attempt added wrongly"}


async def test_structured_sage_plan_is_json_rendered_to_headings():
    leaky = {**PLAN, "lessons": "the answer is 14"}
    backend = StrictBackend([
        (r"Do not solve the problem", json.dumps(leaky, separators=(",", ":"))),
        (r"plan drawn from an earlier attempt", "Following the plan: 7, 14. \\boxed{14}"),
        (r".*", "first try \\boxed{16}"),
    ])
    c = ctx(backend)
    attempt = await SAGE(CoT(), plan_tokens=200).solve(task(), c)
    [plan_call] = prompts(backend, "Do not solve the problem")
    form = plan_call.params.constraint
    assert form.kind == "json" and form.name == "plan"
    assert list(form.json_schema["properties"]) == ["goal", "known", "key_steps",
                                                    "dependencies", "pitfalls", "lessons"]
    assert form.json_schema["properties"]["goal"]["maxLength"] == 100  # 4 x 200 / 8
    assert form.json_schema["properties"]["key_steps"]["maxItems"] == 6
    assert not form.accepts(json.dumps({**PLAN, "goal": ""}))
    assert '"key_steps": ["...", "..."]' in plan_call.messages[-1].content
    assert plan_call.params.max_tokens == form.max_chars + 1 == 900  # a full plan closes
    [rollout] = prompts(backend, "plan drawn from an earlier attempt")
    note = rollout.messages[-1].content
    assert "Goal: the apples in the end\nKnown:" in note
    assert "Key steps:\n1. add the bought apples\n2. double the pile" in note
    assert "the answer is 14" not in note and attempt.metadata["plan_dropped_lines"] == 1
    assert attempt.answer == "14"
    assert parse_records(c) == [("sage", "plan", [True], True)]


def test_render_plan_reads_only_complete_json_plans():
    assert render_plan(json.dumps(PLAN)).startswith("Goal: the apples in the end\n")
    assert render_plan('{"goal": "x"}') is None
    assert render_plan("Goal: x") is None
    assert plan_schema(300) is plan_schema(300)  # built once per cap


async def test_sage_free_path_and_unparsed_json_fallback():
    free = ScriptedBackend([
        (r"Do not solve the problem", "Goal: count apples.\nKey steps: add, then double."),
        (r".*", "try \\boxed{14}")])
    c = ctx(free)
    attempt = await SAGE(CoT(), structured=False).solve(task(), c)
    [plan_call] = prompts(free, "Do not solve the problem")
    assert plan_call.params.constraint is None and "JSON" not in plan_call.messages[-1].content
    assert attempt.metadata["plan"] == "Goal: count apples.\nKey steps: add, then double."
    assert parse_records(c) == [("sage", "plan", [False], False)]  # 4 headings missing
    # structured, but the reply is not the JSON (a length cut): used as free text
    cut = ScriptedBackend([(r"Do not solve the problem", '{"goal": "count apples", "kn'),
                           (r".*", "try \\boxed{14}")])
    c = ctx(cut)
    attempt = await SAGE(CoT()).solve(task(), c)
    assert attempt.metadata["plan"] == '{"goal": "count apples", "kn'
    assert parse_records(c) == [("sage", "plan", [False], True)]


# ----------------------------------------------------------------------------- best_of_n


async def test_structured_best_of_n_judge_ends_in_a_grade():
    grades = {"A": 4, "B": 9, "C": 6}
    backend = StrictBackend([
        (r"grading a solution",
         lambda m, p, i: f"Checked it.\nScore: {grades[m[-1].content.split('Solution:')[1][1]]}"),
        (r".*", ["A \\boxed{1}", "B \\boxed{2}", "C \\boxed{3}"])])
    c = ctx(backend)
    attempt = await BestOfN(CoT(), n=3).solve(task(), c)
    forms = constraints(backend, "grading a solution")
    assert len(forms) == 3 and forms[0].regex.endswith(r"\nScore: (?:10|9|8|7|6|5|4|3|2|1)")
    assert constraints(backend, "step by step")[0] is None  # the samples are free
    assert attempt.answer == "2" and attempt.metadata["grade"] == 9
    assert parse_records(c) == [("best_of_n", "judge", [True], True)] * 3


async def test_best_of_n_free_path():
    backend = ScriptedBackend([(r"grading a solution", "looks fine"), (r".*", "\\boxed{1}")],
                              structured_outputs=NONE)
    c = ctx(backend)
    attempt = await BestOfN(CoT(), n=2).solve(task(), c)
    assert all(call.params.constraint is None for call in backend.calls)
    assert attempt.metadata["fallback"] == "unreadable grade -> neutral"
    assert parse_records(c) == [("best_of_n", "judge", [False], False)] * 2
    off = ScriptedBackend([(r"grading a solution", "Score: 7"), (r".*", "\\boxed{1}")])
    await BestOfN(CoT(), n=2, structured=False).solve(task(), ctx(off))
    assert all(call.params.constraint is None for call in off.calls)


# ------------------------------------------------------------------ structured=True refused


@pytest.mark.parametrize("spec, kinds", [
    ("critique_refine(structured=True)", "'regex'"), ("dei(cot, structured=True)", "'regex'"),
    ("sage(structured=True)", "'json'"), ("best_of_n(n=2, structured=True)", "'regex'"),
])
async def test_structured_true_without_support_is_refused_before_any_call(spec, kinds):
    backend = ScriptedBackend([(r".*", "\\boxed{1}")], structured_outputs=NONE)
    name = spec.split("(")[0]
    with pytest.raises(StructuredModeError,
                       match=rf"{name}\(structured=True\) needs {kinds} constraints.*"
                             r"supports: none\); use .*structured=False"):
        await strategies.build(spec).solve(task(), ctx(backend))
    assert backend.calls == []
