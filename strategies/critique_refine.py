"""Generate -> critique on a 1-4 rubric -> refine with the directive; keep the best."""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Detail,
    LoopStrategy,
    Scored,
    StructuredParams,
    attempt_from,
    record_parse,
    step_params,
)
from refinery.strategies.cot import CoT
from refinery.strategies.parsing import after
from refinery.strategies.spec import ChildCost

DIMENSIONS = ("correctness", "completeness", "reasoning validity", "format")
NEUTRAL = 2.5  # an unreadable dimension score, as in the released code
MAX_CRITIQUE = 2000  # characters of critique shown to the refiner

CRITIQUE = """Review the solution below as a strict examiner.

Problem:
{question}

Solution:
{solution}

First say in one or two sentences what the problem requires. Then grade the solution \
on each dimension from 1 (poor) to 4 (excellent), each with a one-line reason, exactly \
in this form:
Correctness: N - reason
Completeness: N - reason
Reasoning validity: N - reason
Format: N - reason
Summary: one sentence.
Directive: what concretely to change in the solution."""

# Structured mode: the form CRITIQUE asks for, each free part one bounded line (no line
# break, so the next label always follows: deterministic, at most ~1,300 characters).
CRITIQUE_FORM = Constraint.from_regex(
    r"[^\n]{1,240}\n"
    + "".join(rf"{dim.capitalize()}: [1-4] - [^\n]{{1,140}}\n" for dim in DIMENSIONS)
    + r"Summary: [^\n]{1,200}\nDirective: [^\n]{1,300}")

REFINE = ("A reviewer checked your solution.\n{critique}\n\nRevise the solution following "
          "the directive: solve the problem again step by step, fix what was criticised, "
          "and write the final answer as \\boxed{{...}}.")


def read_rubric(text: str) -> dict[str, float | None]:
    """Each dimension's 1-4 score as written, None where unreadable or out of range."""
    scores: dict[str, float | None] = {}
    for dim in DIMENSIONS:
        m = re.search(rf"{dim}\W{{0,6}}(\d(?:\.\d+)?)", text, re.I)
        value = float(m.group(1)) if m else None
        scores[dim] = value if value is not None and 1 <= value <= 4 else None
    return scores


def parse_critique(text: str) -> tuple[dict[str, float], str]:
    """Per-dimension scores (unreadable -> 2.5) and the revision directive."""
    scores = {dim: NEUTRAL if v is None else v for dim, v in read_rubric(text).items()}
    directive = (after(text, "directive:") or after(text, "summary:") or "").strip()
    return scores, directive or "Re-check every step and correct any mistake."


class Critique(Detail):
    """A parsed critique: what ``stop`` checks (``rubric``) and what the refiner reads
    (``critique``: the whole reply, reasons too, clipped)."""

    rubric: dict[str, float]
    directive: str
    critique: str


class CritiqueRefine(LoopStrategy):
    """``critique_refine(inner, rounds=2, bar=3)``: rubric critique and directed refinement.

    Draft with the inner strategy; critique it on correctness, completeness,
    reasoning validity and format (1-4 each, unreadable = 2.5), with a summary
    and a directive; refine with the directive. Stop when every dimension is
    >= ``bar`` (the skip rule) or when the summed score stops rising; return
    the best-scored attempt, not just the last. Every candidate is critiqued,
    so ``rounds`` refinements cost 2 * rounds + 1 requests beyond the draft.

    ``structured`` (refinery's addition; default: when the backend enforces
    regexes) constrains the critique to the form its prompt shows (:data:`CRITIQUE_FORM`:
    a line on what the problem requires, ``Dimension: 1-4 - reason`` per
    dimension, ``Summary:``, ``Directive:``, each part one bounded line), so
    every score and the directive are readable; ``structured=False`` is the
    free-text critique. Each critique's trace event notes whether all four
    scores parsed.

    Example:
        >>> attempt = await CritiqueRefine(CoT(), rounds=2).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["rubric"]  # doctest: +SKIP
        {'correctness': 4.0, 'completeness': 3.0, 'reasoning validity': 4.0, 'format': 3.0}
    """

    name = "critique_refine"
    min_inner = max_inner = 1
    default_inner = (CoT,)
    structured_kinds = frozenset({"regex"})

    class Params(StructuredParams):
        rounds: int = Field(2, ge=0, le=8, description="refinements at most")
        bar: int = Field(3, ge=1, le=4, description="skip rule: stop when all dimensions >= bar")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return children[0].calls + 2 * params.rounds + 1

    def rounds(self) -> int:
        return self.params.rounds + 1

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[Critique]]) -> list[Attempt]:
        if rnd == 0:
            return [await self.inner[0].solve(task, ctx.inner())]
        [prev] = last
        msgs = [*task.messages, Message(role="assistant", content=prev.attempt.text),
                Message(role="user", content=REFINE.format(critique=prev.detail.critique))]
        gen = await ctx.generate(msgs, step="refine",
                                 strategy=self.name,
                                 parents=[*prev.attempt.events, *prev.events])
        return [attempt_from(gen[0], strategy=self.name, events=[gen.event_id], round=rnd)]

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[Critique]]:
        [attempt] = cands
        prompt = CRITIQUE.format(question=task.question, solution=attempt.text)
        structured = self.structured(ctx)
        params = step_params(ctx, CRITIQUE_FORM if structured else None, temperature=0.0)
        gen = await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                 step="critique", strategy=self.name, parents=attempt.events)
        read = read_rubric(gen[0].text)
        record_parse(ctx, gen.event_id, "critique", [None not in read.values()],
                     structured=structured)
        scores, directive = parse_critique(gen[0].text)
        total = sum(scores.values())
        eid = ctx.emit("critique", directive, strategy=self.name, parents=[gen.event_id],
                       rubric=scores, total=total)
        return [Scored(attempt, total / (4 * len(DIMENSIONS)), events=[gen.event_id, eid],
                       detail=Critique(rubric=scores, directive=directive,
                                       critique=gen[0].text.strip()[:MAX_CRITIQUE]))]

    def stop(self, rnd: int, last: list[Scored[Critique]],
             pool: list[Scored[Critique]]) -> str | None:
        [now] = last
        if all(s >= self.params.bar for s in now.detail.rubric.values()):
            return "every dimension clears the bar"
        if rnd > 0 and (now.score or 0.0) <= (pool[-2].score or 0.0):
            return "score stopped rising"
        return None
