"""The memory strategy and its store: BM25 retrieval, the prompt note, the trace."""

from __future__ import annotations

import json

from refinery import strategies
from refinery.engine.run import solve_one
from refinery.engine.types import Task
from refinery.strategies.memory_store import Lesson, MemoryStore
from tests.scripted_backend import ScriptedBackend

SPEED = "A car travels 50 miles per hour for 2 hours. How many miles does it travel?"


def lesson(lid: str, question: str, text: str, problem: str | None = None) -> Lesson:
    return Lesson(id=lid, problem_id=problem or lid, question=question, lesson=text,
                  author="policy")


STORE = MemoryStore(lessons=[
    lesson("a", "Ava has 5 apples and buys 3 more apples. How many apples?",
           "When someone buys more, add the amount bought."),
    lesson("b", "A train travels 60 miles per hour for 3 hours. How far does it travel?",
           "Distance is speed times the hours travelled."),
    lesson("c", "Kim shares 12 cookies equally among 4 friends. How many each?",
           "Sharing equally means dividing by the number of friends."),
])


def test_retrieval_ranks_the_lesson_of_a_similar_question_first(tmp_path) -> None:
    assert STORE.retrieve(SPEED, k=1) == ["Distance is speed times the hours travelled."]
    assert STORE.retrieve("Ben has 2 apples and buys 6 more apples.", k=3)[0] == (
        "When someone buys more, add the amount bought.")
    assert STORE.retrieve("Quantum zebra?", k=3) == []
    STORE.save(tmp_path / "m")
    assert MemoryStore.load(tmp_path / "m") == STORE
    assert len((tmp_path / "m" / "lessons.jsonl").read_text().splitlines()) == 3


async def test_memory_puts_the_lessons_in_the_prompt_and_the_trace_keeps_the_question(
        tmp_path) -> None:
    STORE.save(tmp_path / "m")
    be = ScriptedBackend([(r".*", "50 × 2 = 100. The answer is \\boxed{100}.")])
    spec = f"memory(cot, store={json.dumps(str(tmp_path / 'm'))}, k=1)"
    trace = await solve_one(strategies.build(spec), Task.from_prompt(SPEED), be)
    prompt = be.calls[0].messages[-1].content
    assert prompt.startswith(SPEED)
    assert "Lessons from similar problems:\n- Distance is speed times the hours" in prompt
    assert "add the amount bought" not in prompt  # k=1
    assert trace.task.question == SPEED and trace.attempt.answer == "100"
    [recall] = [e for e in trace.events if e.step == "memory"]
    assert recall.data["lessons"] == 1
