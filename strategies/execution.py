"""Running model-written programs: the one home of what pot, self_debug and tir share.

A program is read out of a reply (its fenced block), completed so that it shows
its result (``print(solution())`` when it defines ``solution`` and prints
nothing), run in the sandbox, and judged: it failed when it raised, timed out,
printed nothing, or printed something that is not a number where a number is
wanted. A failure carries what a repair turn shows the model: the error's last
lines.

The sandbox is the bubblewrap jail of :mod:`refinery.verifiers.sandbox`; one is
shared by every execution strategy of a process, so its worker cap bounds the
programs running at once however many strategies run.

Example:
    >>> reply = "```python\\ndef solution():\\n    return 6 * 7\\n```"
    >>> read_program(reply)
    'def solution():\\n    return 6 * 7\\n\\nprint(solution())\\n'
    >>> run = await execute(reply)  # doctest: +SKIP
    >>> run.answer, run.ok  # doctest: +SKIP
    ('42', True)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from refinery.engine.constraints import Constraint
from refinery.engine.types import Message, Task
from refinery.strategies.base import with_question
from refinery.verifiers.code import extract_code
from refinery.verifiers.sandbox import RunResult, Sandbox, SandboxConfig

__all__ = ["Execution", "execute", "execute_block", "execution_sandbox", "program_constraint",
           "read_program", "with_examples"]

# What a repair turn and a trace show of a failure: enough of a traceback to name
# the error and its line, not a page of it.
ERROR_CHARS = 600
OUTPUT_CHARS = 600
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:e-?\d+)?$", re.IGNORECASE)
_CALLS_SOLUTION = re.compile(r"^\s*print\s*\(\s*solution\s*\(\s*\)\s*\)", re.MULTILINE)


@functools.cache
def execution_sandbox() -> Sandbox:
    """The process's sandbox for model programs: short limits, since a program that
    computes an answer needs milliseconds, and one that loops should cost little."""
    return Sandbox(SandboxConfig(wall_timeout=5.0, cpu_seconds=5, memory_mb=256))


def program_constraint(max_lines: int = 8, line_chars: int = 100) -> Constraint:
    """One fenced block holding ``def solution():`` and 1..max_lines indented lines.

    The form a small model completes best: a function it must fill, and no room for
    prose, ``input()`` reads or a definition it never calls (the harness calls it).
    """
    line = rf"    [^\n]{{1,{line_chars}}}\n"
    return Constraint.from_regex(rf"```python\ndef solution\(\):\n(?:{line}){{1,{max_lines}}}```")


def with_examples(task: Task, examples: Sequence[tuple[str, str]],
                  instruction: str) -> list[Message]:
    """The task's conversation after worked exchanges (PAL's few-shot form, as chat
    turns), the instruction appended to every question. Shown after the question
    instead, a 135M model copies the example's program verbatim."""
    shots = [m for question, reply in examples
             for m in (Message(role="user", content=f"{question}\n\n{instruction}"),
                       Message(role="assistant", content=reply))]
    system = [m for m in task.messages[:1] if m.role == "system"]
    rest = task.messages[len(system):]
    return [*system, *shots, *with_question(rest, instruction)]


def read_program(reply: str) -> str:
    """The program in ``reply``, completed so that it prints its result."""
    code = extract_code(reply, "solution").strip("\n") + "\n"
    defines = re.search(r"^def solution\s*\(\s*\)", code, re.MULTILINE)
    if defines and not _CALLS_SOLUTION.search(code):
        code += "\nprint(solution())\n"
    return code


def program_block(program: str) -> str:
    """``program`` fenced as a run's report (and a trace) shows it."""
    return f"```python\n{program.rstrip()}\n```"


@dataclass(frozen=True)
class Execution:
    """One program's run: its answer (the last line it printed), or why it failed."""

    program: str
    answer: str | None
    error: str | None
    seconds: float
    stdout: str = ""  # what it printed, its last OUTPUT_CHARS (tir shows it to the model)

    @property
    def ok(self) -> bool:
        return self.error is None

    def report(self) -> str:
        """The run as a trace and a thinking pane show it."""
        shown = f"output: {self.answer}" if self.ok else f"error: {self.error}"
        return f"{program_block(self.program)}\n{shown}"


def judge(program: str, result: RunResult, *, numeric: bool) -> Execution:
    """What ``result`` says about ``program``'s answer."""
    lines = [s.strip() for s in result.stdout.splitlines() if s.strip()]
    answer = normalize_number(lines[-1]) if lines else None
    error = None
    if result.timed_out:
        error = f"the program did not finish within {result.duration:.0f} seconds"
    elif not result.passed:
        error = (result.stderr.strip() or result.reason)[-ERROR_CHARS:]
    elif answer is None or answer == "None":
        error = "the program printed nothing" + (
            " (return the answer from solution())" if "def solution" in program
            else " (print the value you need)")
    elif numeric and not _NUMBER.match(answer.replace(",", "")):
        error = f"the program printed {answer[:80]!r}, not a number"
    return Execution(program, answer if error is None else None, error, result.duration,
                     result.stdout.strip()[-OUTPUT_CHARS:])


def normalize_number(text: str) -> str:
    """``'42.0'`` -> ``'42'``; other text unchanged (the math checker compares values)."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


async def execute(reply: str, *, numeric: bool = True,
                  sandbox: Sandbox | None = None) -> Execution:
    """Run the program in ``reply`` in the sandbox and judge its output."""
    program = read_program(reply)
    result = await (sandbox or execution_sandbox()).run_python(program)
    return judge(program, result, numeric=numeric)


async def execute_block(code: str, *, sandbox: Sandbox | None = None) -> Execution:
    """Run ``code`` as written (a block inside the reasoning: nothing is added) and
    judge it; any printed value counts, a number or not."""
    result = await (sandbox or execution_sandbox()).run_python(code)
    return judge(code, result, numeric=False)
