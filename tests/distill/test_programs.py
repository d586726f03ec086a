"""Verified programs as rows: refinery.distill.programs and the program path of the build."""

from __future__ import annotations

from refinery.distill.programs import program_rationale
from refinery.engine.trace import TraceEvent
from refinery.strategies.execution import Execution, read_program
from tests.distill._runs import Problem, gen, write_run
from tests.distill.test_dataset import Q1, Q2, run_build, sft_of

PENS = "def solution():\n    pens = 5 * 12\n    sold = 17\n    return pens - sold\n"


def test_a_program_reads_as_the_worked_solution_it_computes() -> None:
    assert program_rationale(PENS) == (
        "pens = 5 × 12 = 60.\nsold = 17.\npens - sold = 60 - 17 = 43.\n"
        "The answer is \\boxed{43}.")
    text = program_rationale("def solution():\n    per_day = 15 * 6\n    total = per_day\n"
                             "    total += 10\n    return total / 4\n")
    assert text is not None and "per day = 15 × 6 = 90." in text
    assert "total = total + 10 = 90 + 10 = 100." in text and text.endswith("\\boxed{25}.")


def test_programs_outside_the_arithmetic_subset_give_no_rationale() -> None:
    for program in ("def solution():\n    import os\n    return 1\n",
                    "def solution():\n    t = 0\n    for i in range(3):\n        t += i\n"
                    "    return t\n",
                    "def solution():\n    return open('x').read()\n",
                    "def solution():\n    return 2 ** 100000\n",
                    "def solution():\n    return 1 / 0\n",
                    "def solution():\n    return undefined\n",
                    "def solution(:\n", "print(42)\n"):
        assert program_rationale(program) is None, program


def test_a_rationale_must_reach_what_the_sandbox_printed() -> None:
    assert program_rationale(PENS, "43") is not None
    assert program_rationale(PENS, "43.0") is not None
    assert program_rationale(PENS, "44") is None


def pot_problem(pid: str, programs: list[str], printed: list[str | None], gold: str,
                final: int = 0, question: str = Q1) -> Problem:
    """sc(pot, n=k): one generation of k programs, each with its execute event."""
    replies = [f"```python\n{p}```" for p in programs]
    events = [gen("g", "draft", replies, strategy="pot", question=question)]
    for i, (reply, out) in enumerate(zip(replies, printed, strict=True)):
        report = Execution(read_program(reply), out, None if out else "boom", 0.0).report()
        events.append(TraceEvent(id=f"x{i}", kind="step", step="execute", strategy="pot",
                                 parents=["g"], text=report,
                                 data={"ok": out is not None, "answer": out}))
    final_text = events[1 + final].text + f"\n\nThe answer is \\boxed{{{printed[final]}}}."
    return Problem(pid, question, gold, events, final=final_text, final_events=["g"],
                   strategy="sc(pot, n=4)")


RIGHT = "def solution():\n    apples = 3\n    return apples + 4\n"
WRONG = "def solution():\n    apples = 3\n    return apples + 5\n"


def test_program_candidates_answer_what_they_printed_and_failed_runs_are_dropped(
        tmp_path) -> None:
    prob = pot_problem("p1", [RIGHT, WRONG, "def solution():\n    return x\n"],
                       ["7", "8", None], "7")
    stats, sft, _ = run_build(tmp_path, [prob])
    assert stats.dropped == {"failed_run": 1}
    assert [r["messages"][-1]["content"] for r in sft] == [
        "apples = 3.\napples + 4 = 3 + 4 = 7.\nThe answer is \\boxed{7}."]
    assert sft[0]["metadata"]["strategy"] == "pot" and sft[0]["metadata"]["answer"] == "7"


def test_program_rows_keep_the_code_when_asked(tmp_path) -> None:
    prob = pot_problem("p1", [RIGHT, WRONG], ["7", "8"], "7")
    _, sft, _ = run_build(tmp_path, [prob], program_rows="program")
    assert sft[0]["messages"][-1]["content"] == f"```python\n{RIGHT}```"


def test_reinforce_rej_drops_all_right_prompts_and_raft_keeps_them(tmp_path) -> None:
    easy = pot_problem("p1", [RIGHT, RIGHT.replace("apples", "a")], ["7", "7"], "7")
    mixed = pot_problem("p2", [RIGHT, WRONG], ["7", "8"], "7", question=Q2)
    raft = write_run(tmp_path, "a", [easy, mixed])
    from refinery.distill.dataset import build

    stats = build([raft], tmp_path / "raft.jsonl", prompt_filter="raft")
    assert stats.problems_with_sft == 2 and stats.filtered_all_right == 0
    stats = build([raft], tmp_path / "rej.jsonl", prompt_filter="reinforce_rej")
    assert stats.problems_with_sft == 1 and stats.filtered_all_right == 1
    assert {r["metadata"]["problem_id"] for r in sft_of(tmp_path / "rej.jsonl")} == {"p2"}


def test_a_failed_run_counts_as_a_wrong_attempt_for_reinforce_rej(tmp_path) -> None:
    prob = pot_problem("p1", [RIGHT, "def solution():\n    return x\n"], ["7", None], "7")
    stats, sft, _ = run_build(tmp_path, [prob], prompt_filter="reinforce_rej")
    assert len(sft) == 1 and stats.filtered_all_right == 0
