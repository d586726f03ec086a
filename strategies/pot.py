"""Program of thought: the model writes a program, the sandbox computes the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.trace import StepKind
from refinery.engine.types import Attempt, Completion, Message, SamplingParams, Task
from refinery.strategies.base import Strategy, StructuredParams, step_params
from refinery.strategies.execution import Execution, execute, program_constraint, with_examples
from refinery.strategies.spec import ChildCost

INSTRUCTION = ("Do not solve it in words. Write a Python function solution() that computes "
               "the answer and returns it, as one ```python block.")

# Worked exchanges, the first for every solve, more with ``shots``: one short
# program first, then multi-step ones with a name for every quantity (PAL's form).
EXAMPLES = (
    ("A shop has 5 boxes of 12 pencils and sells 17 pencils. How many are left?",
     "```python\ndef solution():\n    pencils = 5 * 12\n    sold = 17\n"
     "    return pencils - sold\n```"),
    ("Mia earns $15 an hour and works 6 hours a day for 4 days. She spends $90 on a "
     "coat. How much money does she have left?",
     "```python\ndef solution():\n    earned_per_day = 15 * 6\n    earned = earned_per_day * 4\n"
     "    coat = 90\n    return earned - coat\n```"),
    ("A farm has 3 times as many hens as cows. There are 8 cows. Half of the hens lay "
     "eggs, 2 eggs each. How many eggs are laid?",
     "```python\ndef solution():\n    cows = 8\n    hens = 3 * cows\n    laying = hens / 2\n"
     "    return laying * 2\n```"),
    ("A book costs $12 and a pen costs a quarter of that. Leo buys 2 books and 3 pens. "
     "What does he pay?",
     "```python\ndef solution():\n    book = 12\n    pen = book / 4\n"
     "    return 2 * book + 3 * pen\n```"),
)

REPAIR = ("Running your program failed:\n{error}\n\nWrite the whole program again, fixed, "
          "as one ```python block with def solution():.")


class ProgramOfThought(Strategy):
    """``pot(repairs=2)``: the model writes a program; its printed result is the answer.

    The model is shown one worked example and asked for ``def solution():``; the
    sandbox runs it with ``print(solution())`` appended when the program prints
    nothing itself. A program that raises, times out, prints nothing or prints no
    number gets a repair turn: the program and its error go back to the model,
    up to ``repairs`` times (self-debugging). In structured mode the reply is
    constrained to one fenced block of ``def solution():`` and a few lines, the
    form a small model fills best. ``sc(pot, n=8)`` draws its 8 programs in one
    request and votes over what they printed.

    Sources: Chen et al. 2022, "Program of Thoughts Prompting"; Gao et al. 2022,
    "PAL: Program-aided Language Models"; Chen et al. 2023, "Teaching Large
    Language Models to Self-Debug".

    Example:
        >>> pot = ProgramOfThought(repairs=1)
        >>> attempt = await pot.solve(Task.from_prompt("6 * 7?"), ctx)  # doctest: +SKIP
        >>> attempt.answer, attempt.metadata["runs"]  # doctest: +SKIP
        ('42', 1)
    """

    name = "pot"

    class Params(StructuredParams):
        repairs: int = Field(2, ge=0, le=8, description="repair turns after a failed run")
        temperature: float | None = Field(None, ge=0.0, le=2.0,
                                          description="None: the context's default")
        numeric: bool = Field(True, description="an answer that is not a number is a failure")
        instruction: str = Field(INSTRUCTION, description="appended to the question")
        shots: int = Field(1, ge=1, le=len(EXAMPLES), description="worked examples shown")

    structured_kinds = frozenset({"regex"})

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return 1 + params.repairs

    def messages(self, task: Task) -> list[Message]:
        """The task's conversation, after one worked question and its program."""
        return with_examples(task, EXAMPLES[: self.params.shots], self.params.instruction)

    async def sample(self, task: Task, ctx: Context, n: int, *,
                     temperature: float | None = None, logprobs: bool = False,
                     final: bool = False, step: StepKind = "draft",
                     parents: Sequence[str] = ()) -> list[Attempt]:
        """``n`` programs from one request, each run and repaired on its own."""
        temp = temperature if temperature is not None else self.params.temperature
        constraint = program_constraint() if self.structured(ctx) else None
        params = step_params(ctx, constraint, logprobs=logprobs or ctx.params.logprobs,
                             **({} if temp is None else {"temperature": temp}))
        messages = self.messages(task)
        gen = await ctx.generate(messages, params, n=n, step=step, strategy=self.name,
                                 parents=parents)
        return list(await asyncio.gather(*(
            self._run_and_repair(ctx, messages, params, comp, gen.event_id) for comp in gen)))

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        [attempt] = await self.sample(task, ctx, 1)
        return attempt

    async def _run_and_repair(self, ctx: Context, messages: list[Message],
                              params: SamplingParams, comp: Completion,
                              event_id: str) -> Attempt:
        run = await self._execute(ctx, comp.text, event_id)
        runs, events = [run], [event_id]
        while not run.ok and len(runs) <= self.params.repairs:
            turn = [*messages, Message(role="assistant", content=comp.text),
                    Message(role="user", content=REPAIR.format(error=run.error))]
            try:
                gen = await ctx.generate(turn, params, step="refine", strategy=self.name,
                                         parents=[events[-1]])
            except BudgetExhausted:
                break  # the failed run stands: an answerless attempt, not a lost task
            [comp] = gen
            events.append(gen.event_id)
            run = await self._execute(ctx, comp.text, gen.event_id)
            runs.append(run)
        return self._attempt(run, runs, comp, events)

    async def _execute(self, ctx: Context, reply: str, parent: str) -> Execution:
        run = await execute(reply, numeric=self.params.numeric)
        ctx.emit("execute", run.report(), strategy=self.name, parents=[parent],
                 ok=run.ok, answer=run.answer, error=run.error, seconds=run.seconds)
        return run

    def _attempt(self, run: Execution, runs: list[Execution], comp: Completion,
                 events: list[str]) -> Attempt:
        text = run.report() + (f"\n\nThe answer is \\boxed{{{run.answer}}}." if run.ok else "")
        return Attempt(text=text, answer=run.answer, finish_reason=comp.finish_reason,
                       strategy=self.name, events=events,
                       metadata={"tokens": comp.completion_tokens, "logprob": comp.logprob,
                                 "runs": len(runs), "repairs": len(runs) - 1,
                                 "repaired": len(runs) > 1 and run.ok,
                                 "error": run.error, "program": run.program})
