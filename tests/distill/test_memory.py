"""Procedural memory built from runs: lesson checks, patterns, the self-teacher's rows."""

from __future__ import annotations

import json

from refinery.distill.dataset import build
from refinery.distill.memory import build_memory, cluster_patterns, names_the_problem
from refinery.engine.trace import read_traces
from refinery.eval.datasets import load_dataset
from refinery.eval.runner import EvalConfig, run_eval
from refinery.strategies.memory_store import MemoryStore
from tests.distill._runs import write_run
from tests.distill.test_dataset import Q1, Q2, Q3, sc_problem
from tests.scripted_backend import ScriptedBackend
from tests.strategies.test_memory import lesson

DAN = "Dan has 3 pens and buys 4 more. How many pens does Dan have?"


def test_a_lesson_names_the_problem_by_its_answer_or_its_numbers() -> None:
    question = "Sam has 1,200 shells and finds 26 more. How many shells now?"
    assert names_the_problem("So the total is 1226.", question, "1226")
    assert names_the_problem("Start from 1200 and add.", question, "1226")
    assert names_the_problem("The correct solution is 12.", question, "1226")  # any answer
    assert not names_the_problem("Add what is found to what one has.", question, "1226")
    assert not names_the_problem("An hour is 60 minutes: convert first.", question, "1226")


def _mixed(pid: str, question: str, gold: str, wrong: str) -> object:
    texts = [f"So it is {gold}. The answer is \\boxed{{{gold}}}.",
             f"So it is {wrong}. The answer is \\boxed{{{wrong}}}."]
    return sc_problem(pid, question, texts, gold)


def _policy(messages, params, i) -> str:
    """Lessons by name; re-solves right or wrong by name and by whether a lesson is shown."""
    text = messages[-1].content
    if "state the general rule" in text:
        return {"Ava": "Add what is bought to what one has.", "Ben": "Subtract what is lost.",
                "Kara": "Count the eggs found too.",
                "Dan": "The correct solution is \\boxed{7}."}[text.split()[1]]
    noted = "Lessons from similar problems" in text
    name = text.split()[0]
    right = {"Ava": noted, "Ben": False, "Kara": not noted, "Dan": noted}[name]
    gold = {"Ava": "7", "Ben": "5", "Kara": "8", "Dan": "7"}[name]
    return f"The answer is \\boxed{{{gold if right else 99}}}."


async def test_a_lesson_is_kept_only_when_it_turns_a_failed_re_solve_into_a_solved_one(
        tmp_path) -> None:
    run = write_run(tmp_path, "run", [_mixed("p1", Q1, "7", "6"), _mixed("p2", Q2, "5", "4"),
                                      _mixed("p3", Q3, "8", "9"), _mixed("p4", DAN, "7", "8")],
                       record_task=True)
    stats = await build_memory([run], tmp_path / "mem", ScriptedBackend([(r".*", _policy)]),
                               round=1)
    assert (stats.mixed_problems, stats.lessons_written) == (4, 4)
    # Ava: wrong without, right with (kept); Ben: wrong both ways; Kara: right without;
    # Dan's "lesson" hands over the answer: it would flip the re-solve, and is not tried.
    assert (stats.lessons_kept, stats.lessons_unchanged, stats.lessons_worse) == (1, 1, 1)
    assert stats.lessons_specific == 1
    store = MemoryStore.load(tmp_path / "mem")
    assert [(x.problem_id, x.lesson, x.round) for x in store.lessons] == [
        ("p1", "Add what is bought to what one has.", 1)]
    assert len(store.trajectories) == 8
    assert sorted(t.passed for t in store.trajectories) == [False] * 4 + [True] * 4


def test_patterns_group_lessons_of_different_problems_that_share_their_words() -> None:
    lessons = [lesson("a", "q1", "Multiply the price by the number of items bought.", "p1"),
               lesson("b", "q2", "Multiply the number of items bought by the price.", "p2"),
               lesson("c", "q3", "Multiply price by number of items.", "p2"),
               lesson("d", "q4", "Distance is speed times time.", "p4")]
    [pattern] = cluster_patterns(lessons)
    assert pattern.problems == 2 and set(pattern.lessons) == {"a", "b", "c"}
    assert {"multiply", "price", "items"} <= set(pattern.keywords)
    # One problem's lessons alone are no pattern.
    assert cluster_patterns(lessons[1:]) == []


async def test_the_self_teachers_targets_carry_memory_and_the_students_prompts_do_not(
        tmp_path) -> None:
    examples = load_dataset("arith", split="train", limit=3)
    store = MemoryStore(lessons=[lesson(f"l{i}", ex.prompt, f"Lesson {i}: follow each step.")
                                 for i, ex in enumerate(examples)])
    store.save(tmp_path / "m")
    golds = {ex.prompt: ex.gold for ex in examples}

    def solve(messages, params, i) -> str:
        question = next(q for q in golds if messages[-1].content.startswith(q))
        return f"Step by step. The answer is \\boxed{{{golds[question]}}}."

    spec = f"memory(cot, store={json.dumps(str(tmp_path / 'm'))})"
    cfg = EvalConfig(dataset="arith", strategy=spec, out=str(tmp_path / "teacher"),
                     split="train", limit=3)
    await run_eval(cfg, backend=ScriptedBackend([(r".*", solve)]), examples=examples,
                   progress=False)
    generations = [e for t in read_traces(tmp_path / "teacher" / "traces.jsonl")
                   for e in t.events if e.kind == "generation"]
    assert len(generations) == 3
    assert all("Lessons from similar problems" in e.messages[-1].content for e in generations)
    stats = build([tmp_path / "teacher"], tmp_path / "sft.jsonl")
    rows = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert stats.sft_rows == 3 and len(rows) == 3
    assert {r["messages"][0]["content"] for r in rows} == set(golds)
    assert not any("Lesson" in m["content"] for r in rows for m in r["messages"])
