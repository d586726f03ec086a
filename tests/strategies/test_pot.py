"""pot's control flow on a scripted backend, its programs run in the real sandbox."""

from __future__ import annotations

from refinery.engine.constraints import Constraint
from refinery.strategies import build
from refinery.strategies.execution import execute, program_constraint, read_program
from refinery.strategies.pot import ProgramOfThought
from refinery.strategies.self_consistency import SelfConsistency
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task


def fenced(*lines: str) -> str:
    return "```python\ndef solution():\n" + "".join(f"    {s}\n" for s in lines) + "```"


RIGHT = fenced("apples = 3 + 4", "return apples * 2")
RAISES = fenced("return undefined_name * 2")
LOOPS = fenced("while True:", "    pass")
NOTHING = fenced("x = 14")


async def test_a_running_program_is_the_answer_in_one_call():
    backend = ScriptedBackend([(r".*", RIGHT)])
    attempt = await ProgramOfThought().solve(task(), ctx(backend))
    assert attempt.answer == "14" and attempt.metadata["runs"] == 1
    [call] = backend.calls
    roles = [m.role for m in call.messages]
    assert roles == ["user", "assistant", "user"]  # a worked exchange, then the question
    assert "def solution()" in call.messages[1].content and "solution()" in call.messages[2].content
    assert "\\boxed{14}" in attempt.text


async def test_a_failing_program_gets_a_repair_turn_with_its_error():
    backend = ScriptedBackend([(r"Running your program failed", RIGHT), (r".*", RAISES)])
    c = ctx(backend)
    attempt = await ProgramOfThought().solve(task(), c)
    first, repair = backend.calls
    turn = [m.role for m in repair.messages]
    assert turn[-2:] == ["assistant", "user"] and repair.messages[-2].content == RAISES
    assert "NameError" in repair.messages[-1].content  # the traceback goes back
    assert attempt.answer == "14" and attempt.metadata["repaired"] is True
    executions = [e for e in c.trace.events if e.step == "execute"]
    assert [e.data["ok"] for e in executions] == [False, True]


async def test_repairs_bound_the_turns_and_a_failure_is_kept_answerless():
    backend = ScriptedBackend([(r".*", RAISES)])
    attempt = await ProgramOfThought(repairs=2).solve(task(), ctx(backend))
    assert len(backend.calls) == 3 and attempt.answer is None
    assert attempt.metadata["runs"] == 3 and "NameError" in attempt.metadata["error"]


async def test_a_non_terminating_program_times_out_and_is_reported():
    backend = ScriptedBackend([(r"did not finish", RIGHT), (r".*", LOOPS)])
    attempt = await ProgramOfThought(repairs=1).solve(task(), ctx(backend))
    assert "did not finish within" in backend.calls[1].messages[-1].content
    assert attempt.answer == "14"


async def test_printing_nothing_or_no_number_is_a_failure():
    nothing = await execute(NOTHING)
    assert not nothing.ok and "printed nothing" in nothing.error
    words = await execute(fenced("return 'fourteen'"))
    assert not words.ok and "not a number" in words.error
    assert (await execute(fenced("return 'fourteen'"), numeric=False)).answer == "fourteen"


async def test_sc_votes_over_executed_answers_from_one_request():
    replies = [RIGHT, fenced("return 7 * 2"), fenced("return 3 + 4"), RAISES]
    backend = ScriptedBackend([(r"Running your program failed", NOTHING), (r".*", replies)])
    attempt = await SelfConsistency(ProgramOfThought(repairs=1), n=4).solve(task(),
                                                                           ctx(backend))
    assert backend.calls[0].n == 4  # the four programs come from one request
    assert attempt.answer == "14" and attempt.metadata["votes"] == {"14": 2, "7": 1}


async def test_structured_mode_constrains_the_reply_to_one_solution_block():
    backend = ScriptedBackend([(r".*", RIGHT)])
    await ProgramOfThought(structured=True).solve(task(), ctx(backend))
    constraint = backend.calls[0].params.constraint
    assert isinstance(constraint, Constraint) and constraint == program_constraint()
    assert constraint.accepts(RIGHT) and not constraint.accepts("The answer is 14.")
    free = ScriptedBackend([(r".*", RIGHT)])
    await ProgramOfThought(structured=False).solve(task(), ctx(free))
    assert free.calls[0].params.constraint is None


def test_the_harness_calls_a_solution_the_program_never_calls():
    assert read_program(RIGHT).endswith("print(solution())\n")
    called = "```python\ndef solution():\n    return 1\nprint(solution())\n```"
    assert read_program(called).count("print(solution())") == 1
    assert read_program("print(2 + 2)") == "print(2 + 2)\n"


def test_pot_is_a_spec_with_its_worst_case():
    assert repr(build("sc(pot(repairs=1), n=4)")) == "sc(pot(repairs=1), n=4)"
    assert ProgramOfThought.worst_case(ProgramOfThought.Params(repairs=3), []) == 4
