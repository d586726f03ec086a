"""OptiLLM's moa, re2 and cot_reflection as refinery strategies: prompts, call counts
against the declared worst case, composition, reasoning steps and budgets."""

from __future__ import annotations

import pytest

from refinery import strategies
from refinery.engine.context import Budget, Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.run import solve_one
from refinery.engine.types import Delta
from refinery.serving.streaming import reasoning_text
from refinery.strategies import Strategy
from refinery.strategies.cot import CoT
from refinery.strategies.cot_reflection import CoTReflection, output_of, section
from refinery.strategies.moa import MoA
from refinery.strategies.re2 import ReRead
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import QUESTION, ProbeBackend, ctx, prompts, task

DRAFTS = ["3 + 4 = 7, doubled 14. \\boxed{14}", "7 then 16. \\boxed{16}",
          "7 and twice is 14. \\boxed{14}"]
REVIEW = "Draft 2 doubled wrongly; 14 is best supported."
SYNTH = "3 + 4 = 7; doubled, 14. \\boxed{14}"
TAGGED = ("<thinking>3 + 4 = 7, then 7 * 2 = 14.</thinking>\n"
          "<reflection>Both steps check out.</reflection>\n<output>\\boxed{14}</output>")


def moa_backend(draft=DRAFTS) -> ScriptedBackend:
    return ScriptedBackend([(r"Several drafts answer", REVIEW), (r"Below are \d+ drafts", SYNTH),
                            (r".*", draft)])


def worst_case(spec: str) -> int:
    return strategies.build_with_graph(spec)[1].graph["worst_case_calls"]


def sink_into(pieces: list[str]):
    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)
    return sink


# ------------------------------------------------------------------------------- re2


async def test_re2_states_the_question_twice_then_the_instruction():
    backend = ScriptedBackend([(r".*", DRAFTS[0])])
    pieces: list[str] = []
    attempt = await ReRead().solve(task(), ctx(backend, final_sink=sink_into(pieces)))
    [call] = backend.calls
    prompt = call.messages[-1].content
    assert prompt.count(QUESTION) == 2
    first, again = prompt.index(QUESTION), prompt.index(f"Read the question again: {QUESTION}")
    assert first < again < prompt.index("step by step")
    assert attempt.answer == "14" and attempt.strategy == "re2"
    assert "".join(pieces) == attempt.text  # at the root it streams, as cot does
    assert len(backend.calls) == worst_case("re2") == 1


async def test_sc_over_re2_is_one_request_of_n_reread_samples():
    backend = ScriptedBackend([(r".*", DRAFTS)])
    sc = strategies.build("sc(re2, n=3)")
    attempt = await sc.solve(task(), ctx(backend))
    [call] = backend.calls
    assert call.n == 3 and call.messages[-1].content.count(QUESTION) == 2
    assert attempt.answer == "14" and attempt.metadata["votes"] == {"14": 2, "16": 1}
    assert len(backend.calls) == worst_case("sc(re2, n=3)") == 1  # the bound is tight


# ------------------------------------------------------------------------------- moa


async def test_moa_drafts_in_one_request_then_critique_then_synthesis():
    backend = moa_backend()
    pieces: list[str] = []
    root = ctx(backend, final_sink=sink_into(pieces))
    attempt = await MoA(CoT(), n=3).solve(task(), root)
    draft, critique, synthesis = backend.calls
    assert draft.n == 3 and draft.params.temperature == 1.0
    critique_prompt = critique.messages[-1].content
    assert QUESTION in critique_prompt and all(d in critique_prompt for d in DRAFTS)
    assert critique.params.temperature == 0.1 and critique.params.max_tokens <= 512
    synth_prompt = synthesis.messages[-1].content
    assert QUESTION in synth_prompt and REVIEW in synth_prompt
    assert all(f"Draft {i}:\n{d}" in synth_prompt for i, d in enumerate(DRAFTS, 1))
    assert attempt.text == SYNTH and attempt.answer == "14" and attempt.strategy == "moa"
    assert "".join(pieces) == SYNTH  # only the synthesis streams as the answer
    assert attempt.metadata["draft_answers"] == ["14", "16", "14"]
    assert len(backend.calls) == worst_case("moa") == 3
    steps = {e.id: e for e in root.trace.events}
    [final] = attempt.events
    assert steps[final].step == "refine"
    assert {steps[p].step for p in steps[final].parents} == {"draft", "critique"}


async def test_moa_over_re2_draws_reread_drafts_in_one_request():
    backend = moa_backend()
    attempt = await strategies.build("moa(re2)").solve(task(), ctx(backend))
    draft = backend.calls[0]
    assert draft.n == 3 and draft.messages[-1].content.count(QUESTION) == 2
    assert attempt.answer == "14"
    assert len(backend.calls) == worst_case("moa(re2)") == 3


async def test_moa_with_a_refining_inner_runs_it_n_times():
    backend = ScriptedBackend([
        (r"strict examiner", "Correctness: 4\nCompleteness: 4\nReasoning validity: 4\nFormat: 4"),
        (r"Several drafts answer", REVIEW), (r"Below are \d+ drafts", SYNTH), (r".*", DRAFTS[0])])
    spec = "moa(critique_refine(rounds=0), n=2)"
    attempt = await strategies.build(spec).solve(task(), ctx(backend))
    assert len(prompts(backend, "strict examiner")) == 2
    assert all(c.n == 1 for c in backend.calls)
    assert attempt.text == SYNTH
    assert len(backend.calls) == worst_case(spec) == 2 * 2 + 2


@pytest.mark.parametrize("max_calls, made", [(1, ["draft"]), (2, ["draft", "critique"])])
async def test_moa_out_of_budget_returns_the_majority_draft(max_calls, made):
    backend = moa_backend(["\\boxed{16}", "\\boxed{14}", "again \\boxed{14}"])
    attempt = await MoA(CoT()).solve(task(), ctx(backend, max_calls=max_calls))
    assert len(backend.calls) == max_calls
    assert attempt.text == "\\boxed{14}"  # 14 twice beats 16; first seen of the two
    assert attempt.metadata["stopped"] == "budget" and attempt.strategy == "moa"
    assert f"call budget of {max_calls} spent" in attempt.metadata["budget_exhausted"]


class OneCall(Strategy):
    """A single-call inner strategy that is not cot (so moa runs it n times)."""

    name = "one_call"

    async def solve(self, task, ctx):
        return await CoT().solve(task, ctx)


async def test_moa_keeps_the_drafts_that_fit_when_drafting_runs_out():
    backend = ProbeBackend([(r".*", ["\\boxed{5}"])])
    attempt = await MoA(OneCall(), n=3).solve(task(), ctx(backend, max_calls=2))
    assert backend.peak == 2 and len(backend.calls) == 2  # the third draft was refused
    assert attempt.answer == "5" and attempt.metadata["drafts"] == 2
    assert "call budget of 2 spent" in attempt.metadata["budget_exhausted"]


async def test_moa_with_no_draft_raises_and_the_run_records_it():
    backend = moa_backend()
    spent = ctx(backend, max_calls=1)
    await CoT().solve(task(), spent)
    with pytest.raises(BudgetExhausted):
        await MoA(CoT()).solve(task(), spent)
    trace = await solve_one(MoA(CoT()), task(), backend, budget=Budget(max_calls=1))
    assert trace.error is None and trace.attempt.metadata["stopped"] == "budget"


# ----------------------------------------------------------------------- cot_reflection


async def test_cot_reflection_returns_the_output_and_emits_its_sections():
    backend = ScriptedBackend([(r"three tagged parts", TAGGED)])
    seen, pieces = [], []
    root = Context(backend, task=task(), listener=seen.append, final_sink=sink_into(pieces))
    attempt = await CoTReflection().solve(task(), root)
    assert "<thinking>" in backend.calls[0].messages[-1].content
    assert attempt.text == "\\boxed{14}" and attempt.answer == "14"
    assert attempt.metadata["output_from"] == "output"
    assert pieces == []  # the raw reply holds the thinking: nothing streams as content
    # live listeners get the sections as steps, not the raw reply (it stays in the trace)
    assert [(e.kind, e.step, e.text) for e in seen] == [
        ("step", "thinking", "3 + 4 = 7, then 7 * 2 = 14."),
        ("step", "reflection", "Both steps check out.")]
    assert reasoning_text(seen[0]).startswith("[cot_reflection · thinking] 3 + 4 = 7")
    [gen] = [e for e in root.trace.events if e.kind == "generation"]
    assert gen.completions[0].text == TAGGED
    assert attempt.events[0] == gen.id and all(e.parents == [gen.id] for e in seen)
    assert len(backend.calls) == worst_case("cot_reflection") == 1


@pytest.mark.parametrize("reply, text, source", [
    (TAGGED, "\\boxed{14}", "output"),
    ("<thinking>7 * 2</thinking><reflection>ok</reflection>So \\boxed{14}.",
     "So \\boxed{14}.", "after_reflection"),
    ("<thinking>7 * 2 = 14</thinking><output></output>", None, "whole_text"),
    ("It is 14, \\boxed{14}", "It is 14, \\boxed{14}", "whole_text"),
    # cut by max_tokens inside the output: the output runs to the end
    ("<thinking>7 * 2</thinking><output>so \\boxed{14} bec", "so \\boxed{14} bec", "output"),
    # an unclosed thinking ends where the next section opens
    ("<thinking>7 * 2<reflection>fine</reflection><output>14</output>", "14", "output"),
])
def test_output_falls_back_and_says_from_where(reply, text, source):
    assert output_of(reply) == (reply.strip() if text is None else text, source)


def test_sections_tolerate_unclosed_and_repeated_tags():
    reply = "<thinking>a</thinking><thinking>b<reflection>c"
    assert section(reply, "thinking") == "b" and section(reply, "reflection") == "c"
    assert section(reply, "output") is None


async def test_cot_reflection_fallback_is_recorded_and_nothing_is_emitted():
    backend = ScriptedBackend([(r".*", "7 then 14. \\boxed{14}")])
    root = ctx(backend)
    attempt = await CoTReflection().solve(task(), root)
    assert attempt.text == "7 then 14. \\boxed{14}" and attempt.answer == "14"
    assert attempt.metadata["output_from"] == "whole_text"
    assert [e.kind for e in root.trace.events] == ["generation"]


async def test_best_of_n_over_cot_reflection_judges_the_outputs_only():
    replies = [TAGGED, TAGGED.replace("\\boxed{14}", "\\boxed{16}"), "no tags \\boxed{9}"]
    grades = {"\\boxed{14}": "Score: 9", "\\boxed{16}": "Score: 3", "\\boxed{9}": "Score: 2"}
    backend = ScriptedBackend([
        (r"grading a solution", lambda m, p, i: next(g for s, g in grades.items()
                                                      if s in m[-1].content)),
        (r"three tagged parts", replies)])
    root = ctx(backend)
    spec = "best_of_n(cot_reflection, n=3)"
    attempt = await strategies.build(spec).solve(task(), root)
    sampled = prompts(backend, "three tagged parts")
    assert len(sampled) == 1 and sampled[0].n == 3  # one request for the n samples
    judged = prompts(backend, "grading a solution")
    assert len(judged) == 3 and not any("<thinking>" in c.messages[-1].content for c in judged)
    assert attempt.text == "\\boxed{14}" and attempt.answer == "14"
    assert sum(e.step == "thinking" for e in root.trace.events) == 2
    assert len(backend.calls) <= worst_case(spec)


# -------------------------------------------------------------------------- registry


def test_registered_with_optillm_names_and_worst_cases():
    names = [d["name"] for d in strategies.describe()]
    assert {"moa", "re2", "cot_reflection"} <= set(names)
    assert strategies.REGISTRY["mixture_of_agents"] is strategies.REGISTRY["moa"]
    assert strategies.REGISTRY["reread"] is strategies.REGISTRY["re2"]
    assert repr(strategies.build("mixture_of_agents(reread, n=4)")) == "moa(re2, n=4)"
    assert repr(MoA()) == "moa(cot)"
    assert worst_case("moa(n=8)") == 3  # cot drafts: one request whatever n
    assert worst_case("moa(cot_reflection, n=5)") == 3
    assert worst_case("moa(sage(cot), n=2)") == 2 * 3 + 2
    assert worst_case("sc(moa, n=2)") == 2 * 3
