"""Self-debugging for code: run the candidate on the examples the prompt shows, fix it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import Strategy, StrategyParams, attempt_from
from refinery.strategies.cot import CoT
from refinery.strategies.execution import execution_sandbox
from refinery.strategies.spec import ChildCost
from refinery.verifiers.code import extract_code

FEEDBACK = ("Your function fails these examples from the problem:\n{failures}\n\n"
            "Write the whole corrected function as one ```python block.")

# `>>> call` then its expected output on the next line (doctest form), or one line
# `call ==> value` / `call ➞ value` as many HumanEval docstrings write examples.
_DOCTEST = re.compile(r"^\s*>>>\s*(.+?)\s*\n\s*(?!>>>)(\S.*?)\s*$", re.MULTILINE)
_ARROW = re.compile(r"^\s*([A-Za-z_]\w*\(.*\))\s*(?:==>|➞|=>)\s*(.+?)\s*$", re.MULTILINE)

_CHECK = """
import json
for call, expected in {examples!r}:
    try:
        got = eval(call)
        want = eval(expected)
        ok = got == want
        shown = repr(got)
    except Exception as e:
        ok, shown = False, f"{{type(e).__name__}}: {{e}}"
    print(json.dumps({{"call": call, "expected": expected, "got": shown[:200], "ok": ok}}))
"""


@dataclass(frozen=True)
class Check:
    """How a candidate did on the visible examples."""

    passed: int
    failures: list[str]
    error: str | None = None


def visible_examples(task: Task) -> list[tuple[str, str]]:
    """The (call, expected) examples a caller passed (``metadata["visible_tests"]``),
    else those the prompt itself shows. Never the hidden tests: they are not in the task."""
    given = task.metadata.get("visible_tests")
    if given:
        return [(str(c), str(e)) for c, e in given]
    text = task.question
    found = _DOCTEST.findall(text) + _ARROW.findall(text)
    return list(dict.fromkeys((c, e) for c, e in found))


def task_imports(task: Task) -> list[str]:
    """The import lines of the code the prompt shows."""
    return [ln.strip() for ln in task.question.splitlines()
            if re.match(r"\s*(?:from\s+\w[\w.]*\s+import|import)\s+\w", ln)]


class SelfDebug(Strategy):
    """``self_debug(inner=cot, rounds=2)``: code checked against the prompt's own examples.

    The inner strategy writes a function; the sandbox runs it on the examples the
    prompt shows (doctest ``>>>`` lines, ``call ==> value`` lines, or tests the
    caller passes as ``metadata["visible_tests"]``), never on the hidden tests the
    verifier grades with. Failing examples (the call, expected and got, or the
    error) go back to the model for a fix, up to ``rounds`` times; the candidate
    that passes most examples is kept (the latest on a tie).

    Source: Chen et al. 2023, "Teaching Large Language Models to Self-Debug".

    Example:
        >>> attempt = await SelfDebug(CoT(), rounds=2).solve(humaneval_task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["examples_passed"], attempt.metadata["examples"]  # doctest: +SKIP
        (3, 3)
    """

    name = "self_debug"
    min_inner = max_inner = 1
    default_inner = (CoT,)

    class Params(StrategyParams):
        rounds: int = Field(2, ge=0, le=8, description="fix turns after a failing check")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return children[0].calls + params.rounds

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        examples = visible_examples(task)
        attempt = await self.inner[0].solve(task, ctx.inner())
        if not examples:
            return attempt  # nothing visible to check against: the inner answer stands
        best, best_check = attempt, await self._check(task, ctx, attempt, examples)
        current, check = attempt, best_check
        for _ in range(self.params.rounds):
            if not check.failures:
                break
            try:
                current = await self._fix(task, ctx, current, check)
            except BudgetExhausted:
                break
            check = await self._check(task, ctx, current, examples)
            if check.passed >= best_check.passed:
                best, best_check = current, check
        return best.model_copy(update={"strategy": self.name, "metadata": {
            **best.metadata, "examples": len(examples), "examples_passed": best_check.passed}})

    async def _check(self, task: Task, ctx: Context, attempt: Attempt,
                     examples: list[tuple[str, str]]) -> Check:
        # The prompt's own imports (``from typing import List``) come first, as the
        # code verifier puts the prompt before the candidate.
        imports = "".join(line + "\n" for line in task_imports(task))
        code = imports + extract_code(attempt.text, task.metadata.get("entry_point"))
        run = await execution_sandbox().run_python(code + _CHECK.format(examples=examples))
        rows = []
        for line in run.stdout.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # the candidate's own prints
        rows = [r for r in rows if isinstance(r, dict) and "ok" in r]
        failures = [f"{r['call']}: expected {r['expected']}, got {r['got']}"
                    for r in rows if not r["ok"]]
        error = None if rows else (run.stderr.strip()[-600:] or run.reason)
        if error:
            failures = [f"the code did not run: {error}"]
        check = Check(sum(r["ok"] for r in rows), failures, error)
        ctx.emit("execute", "\n".join(failures) or "all examples pass", strategy=self.name,
                 parents=attempt.events[-1:], passed=check.passed, examples=len(examples))
        return check

    async def _fix(self, task: Task, ctx: Context, attempt: Attempt, check: Check) -> Attempt:
        turn = [*task.messages, Message(role="assistant", content=attempt.text),
                Message(role="user", content=FEEDBACK.format(failures="\n".join(check.failures)))]
        gen = await ctx.generate(turn, ctx.params, step="refine", strategy=self.name,
                                 parents=attempt.events[-1:])
        [comp] = gen
        return attempt_from(comp, strategy=self.name, events=[gen.event_id])
