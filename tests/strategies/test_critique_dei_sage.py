"""critique_refine, dei and sage control flow."""

from __future__ import annotations

from refinery.engine.types import Delta
from refinery.strategies.cot import CoT
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.dei import DEI
from refinery.strategies.sage import SAGE, plan_schema
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, prompts, task


def rubric(c, k, r, f, directive="fix the sum"):
    return (f"It asks for a count.\nCorrectness: {c} - x\nCompleteness: {k} - x\n"
            f"Reasoning validity: {r} - x\nFormat: {f} - x\nSummary: ok.\nDirective: {directive}")


async def test_critique_refine_stops_when_every_dimension_clears_the_bar():
    backend = ScriptedBackend([(r"strict examiner", rubric(3, 4, 3, 3)),
                               (r".*", "v1 \\boxed{14}")])
    attempt = await CritiqueRefine(CoT(), rounds=2).solve(task(), ctx(backend))
    assert len(backend.calls) == 2 and prompts(backend, "A reviewer checked") == []
    assert attempt.metadata["stopped"] == "every dimension clears the bar"
    assert attempt.score == 13 / 16


async def test_critique_refine_keeps_best_and_stops_when_score_stops_rising():
    grades = {"v1": rubric(2, 2, 2, 2, "recount the apples"), "v2": rubric(3, 3, 2, 3),
              "v3": rubric(2, 2, 1, 2)}
    backend = ScriptedBackend([
        (r"strict examiner", lambda m, p, i: next(g for v, g in grades.items()
                                                   if f"{v} " in m[-1].content)),
        (r"A reviewer checked", lambda m, p, i: "v3 \\boxed{3}" if "v2" in m[-2].content
         else "v2 \\boxed{2}"),
        (r".*", "v1 \\boxed{1}"),
    ])
    attempt = await CritiqueRefine(CoT(), rounds=3).solve(task(), ctx(backend))
    assert attempt.text == "v2 \\boxed{2}" and attempt.score == 11 / 16
    assert attempt.metadata["stopped"] == "score stopped rising"
    assert len(prompts(backend, "A reviewer checked")) == 2  # no third refinement
    first = prompts(backend, "A reviewer checked")[0]
    assert "Directive: recount the apples" in first.messages[-1].content


async def test_critique_refine_unreadable_rubric_is_neutral():
    backend = ScriptedBackend([(r"strict examiner", "I like it!"), (r".*", "\\boxed{1}")])
    attempt = await CritiqueRefine(CoT(), rounds=0).solve(task(), ctx(backend))
    assert set(attempt.metadata["rubric"].values()) == {2.5}


def member_reply(messages, params, i):
    return {0.1: "A says \\boxed{10}", 0.2: "B says \\boxed{12}",
            0.3: "C says \\boxed{12}"}[params.temperature]


def committee():
    return DEI(CoT(temperature=0.1), CoT(temperature=0.2), CoT(temperature=0.3), votes=3)


async def test_dei_highest_mean_wins_with_votes_in_one_request():
    reviews = {"A says": ["Score: 6", "Score: 7", "Score: 8"],
               "B says": ["Score: 9", "nonsense", "Score: 9"],
               "C says": ["Score: 8", "Score: 8", "Score: 8"]}
    backend = ScriptedBackend([
        (r"review committee", lambda m, p, i: next(r[i] for k, r in reviews.items()
                                                    if k in m[-1].content)),
        (r".*", member_reply)])
    attempt = await committee().solve(task(), ctx(backend))
    assert attempt.text == "B says \\boxed{12}" and attempt.score == 0.9
    assert attempt.metadata["means"] == [7.0, 9.0, 8.0]
    review_calls = prompts(backend, "review committee")
    assert [c.n for c in review_calls] == [3, 3, 3]


async def test_dei_tie_gets_a_vote_round_then_majority_answer():
    seen: dict[str, int] = {}

    def review(messages, params, i):
        who = messages[-1].content.split("Candidate solution:\n")[1][:6]
        if i == 0:
            seen[who] = seen.get(who, 0) + 1
        return "Score: 5" if who == "C says" else "Score: 8"

    backend = ScriptedBackend([(r"review committee", review), (r".*", member_reply)])
    attempt = await committee().solve(task(), ctx(backend))
    assert seen == {"A says": 2, "B says": 2, "C says": 1}  # only the tied got a 2nd round
    # still tied 8.0 vs 8.0: B's answer 12 is the majority (B and C), so B beats first-seen A
    assert attempt.text == "B says \\boxed{12}"


async def test_dei_tie_broken_by_the_extra_vote_round():
    rounds: dict[str, int] = {}

    def review(messages, params, i):
        who = messages[-1].content.split("Candidate solution:\n")[1][:6]
        if i == 0:
            rounds[who] = rounds.get(who, 0) + 1
        return "Score: 10" if who == "A says" and rounds[who] == 2 else "Score: 7"

    backend = ScriptedBackend([(r"review committee", review), (r".*", member_reply)])
    attempt = await committee().solve(task(), ctx(backend))
    assert attempt.text == "A says \\boxed{10}"
    assert attempt.metadata["means"][0] == 8.5


async def test_sage_plans_and_the_last_rollout_streams():
    backend = ScriptedBackend([
        (r"Do not solve the problem", "Goal: count apples.\nKey steps: add, then double.\n"
                                      "Final answer: 16"),
        (r"plan drawn from an earlier attempt", "Following the plan: 7, 14. \\boxed{14}"),
        (r".*", "first try \\boxed{16}"),
    ])
    pieces: list[str] = []

    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)

    attempt = await SAGE(CoT()).solve(task(), ctx(backend, final_sink=sink))
    [rollout] = prompts(backend, "plan drawn from an earlier attempt")
    assert "Key steps: add, then double." in rollout.messages[-1].content
    assert "Final answer: 16" not in rollout.messages[-1].content  # leak dropped
    assert attempt.answer == "14" and "".join(pieces) == attempt.text
    [plan] = prompts(backend, "Do not solve the problem")
    # the plan's cap (300) rises to its schema's longest text, so a plan that fills
    # every string still closes its JSON
    assert plan.params.max_tokens == plan_schema(300).max_chars + 1 == 1300
    assert plan.params.temperature == 0.0
    assert attempt.metadata["plan_dropped_lines"] == 1


async def test_members_and_tasks_run_concurrently():
    from refinery.engine.run import run
    from tests.strategies._util import ProbeBackend

    backend = ProbeBackend([(r"review committee", "Score: 7"), (r".*", member_reply)])
    await committee().solve(task(), ctx(backend))
    assert backend.peak == 3  # the three members' drafts, then the three reviews
    backend = ProbeBackend([(r"review committee", "Score: 7"), (r".*", member_reply)])
    tasks = [task().model_copy(update={"id": f"t{i}"}) for i in range(8)]
    traces = await run(committee(), tasks, backend, concurrency=8)
    assert backend.peak == 24 and all(t.attempt is not None for t in traces)
