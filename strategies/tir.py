"""Tool-integrated reasoning: the model reasons in text and runs Python as it goes."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import Field

from refinery.engine.backends.base import require_continuation
from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.types import Attempt, Message, SamplingParams, Task
from refinery.strategies.base import Strategy, StructuredParams, continue_turn, step_params
from refinery.strategies.execution import Execution, execute_block, program_block, with_examples
from refinery.strategies.spec import ChildCost
from refinery.verifiers.math import extract_answer

INSTRUCTION = ("Solve it with Python: write a ```python block that prints what you need; "
               "its output is shown to you in an ```output block. Then write the final "
               "answer as \\boxed{...}.")

# The worked exchange before the question: a 135M model copies a form it has seen
# far better than it follows a description of one.
EXAMPLE_QUESTION = "A shop has 5 boxes of 12 pencils and sells 17 pencils. How many are left?"
EXAMPLE_REPLY = ("The shop has 5 * 12 pencils and sells 17 of them.\n```python\n"
                 "print(5 * 12 - 17)\n```\n```output\n43\n```\nThe answer is \\boxed{43}.")

OUTPUT_FENCE = "```output"
# A python block that closes the text so far (only whitespace after it): the one to run.
_LAST_BLOCK = re.compile(r"```python\n((?:(?!```).)*)```\s*$", re.S)


def block_to_run(text: str) -> str | None:
    """The code of the python block ``text`` ends with, or None (it ends elsewhere)."""
    found = _LAST_BLOCK.search(text)
    return found.group(1) if found else None


def output_block(run: Execution) -> str:
    """What the model sees of a run, as the example shows it."""
    shown = run.stdout if run.ok or run.stdout else f"Error: {run.error}"
    return f"\n{OUTPUT_FENCE}\n{shown or '(nothing printed)'}\n```\n"


def segment_constraint(may_run: bool, prose_chars: int = 300, code_lines: int = 8) -> Constraint:
    """One turn's next segment: some prose, then a python block (while runs are left)
    or the final answer. vLLM ends the sample where the block closes."""
    prose = rf"[^`]{{0,{prose_chars}}}"
    answer = r"The answer is \\boxed\{[^{}\n]{1,40}\}\."
    block = rf"```python\n(?:[^`\n]{{1,100}}\n){{1,{code_lines}}}```"
    return Constraint.from_regex(f"{prose}(?:{block}|{answer})" if may_run
                                 else f"{prose}{answer}")


class ToolIntegratedReasoning(Strategy):
    """``tir(max_calls=4)``: reasoning with a Python interpreter inside it.

    The model writes prose and ```python blocks; generation stops where a block
    closes, the sandbox runs it, its output goes into the reply as an ```output
    block, and the model continues the same turn from there (the backend
    continues a partial assistant message), up to ``max_calls`` runs. The answer
    is read from the finished text. In structured mode each segment is
    constrained to prose then one block or the final ``\\boxed{}`` answer;
    otherwise generation stops at ```output, where ToRA-style models write the
    output fence themselves.

    Sources: Gou et al. 2023, "ToRA: A Tool-Integrated Reasoning Agent"; Yang et
    al. 2024, "Qwen2.5-Math Technical Report" (its TIR format).

    Example:
        >>> attempt = await ToolIntegratedReasoning(max_calls=2).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.answer, attempt.metadata["runs"]  # doctest: +SKIP
        ('43', 1)
    """

    name = "tir"

    class Params(StructuredParams):
        max_calls: int = Field(4, ge=0, le=16, description="code runs in one answer")
        temperature: float | None = Field(None, ge=0.0, le=2.0,
                                          description="None: the context's default")
        instruction: str = Field(INSTRUCTION, description="appended to the question")

    structured_kinds = frozenset({"regex"})

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return 1 + params.max_calls

    def messages(self, task: Task) -> list[Message]:
        """The task's conversation, after one worked question and its reply."""
        return with_examples(task, [(EXAMPLE_QUESTION, EXAMPLE_REPLY)], self.params.instruction)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        require_continuation(ctx.backend)
        messages, structured = self.messages(task), self.structured(ctx)
        text, events, runs, finish = "", [], [], "stop"
        while True:
            may_run = len(runs) < self.params.max_calls
            gen = await continue_turn(ctx, messages, text, self._params(ctx, structured, may_run),
                                      strategy=self.name, parents=events[-1:])
            if gen is None:
                break  # the budget ran out: what was written stands
            [comp] = gen
            events.append(gen.event_id)
            text, finish = text + comp.text, comp.finish_reason
            code = block_to_run(text) if may_run and finish == "stop" else None
            if code is None:
                break
            run = await self._run(ctx, code, gen.event_id)
            runs.append(run)
            text += output_block(run)
        return Attempt(text=text, answer=extract_answer(text), finish_reason=finish,
                       strategy=self.name, events=events,
                       metadata={"runs": len(runs), "failed_runs": sum(not r.ok for r in runs)})

    def _params(self, ctx: Context, structured: bool, may_run: bool) -> SamplingParams:
        temp = self.params.temperature
        changes = {} if temp is None else {"temperature": temp}
        if structured:
            return step_params(ctx, segment_constraint(may_run), **changes)
        stop = [*ctx.params.stop, OUTPUT_FENCE] if may_run else ctx.params.stop
        return step_params(ctx, None, stop=stop, **changes)

    async def _run(self, ctx: Context, code: str, parent: str) -> Execution:
        run = await execute_block(code)
        ctx.emit("execute", f"{program_block(code)}{output_block(run)}",
                 strategy=self.name, parents=[parent], ok=run.ok, error=run.error,
                 seconds=run.seconds)
        return run
