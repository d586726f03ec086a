"""SAGE plan abstraction: rollout -> abstract a plan -> rollout again with the plan."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    Detail,
    LoopStrategy,
    Scored,
    StructuredParams,
    record_parse,
    step_params,
    with_note,
)
from refinery.strategies.cot import CoT
from refinery.strategies.parsing import parse_json_object
from refinery.strategies.spec import ChildCost

ABSTRACT = """Here is a problem and one attempt at it.

Problem:
{question}

Attempt:
{attempt}

Do not solve the problem. Write a short plan (under {words} words) that a fresh attempt \
could follow, with these headings:
Goal: what must be found.
Known: the facts given.
Key steps: the ordered steps, without computing any results.
Dependencies: which step needs which earlier result.
Pitfalls: constraints and easy mistakes.
Lessons: what went wrong in the attempt above, and why.
Do not state the final answer or any computed numbers."""

# Structured mode: the same headings as JSON keys, in order (rendered back to headings).
HEADINGS = (("goal", "Goal"), ("known", "Known"), ("key_steps", "Key steps"),
            ("dependencies", "Dependencies"), ("pitfalls", "Pitfalls"), ("lessons", "Lessons"))
ABSTRACT_JSON = ('Reply with JSON only, one key per heading, in exactly this shape:\n'
                 '{"goal": "...", "known": "...", "key_steps": ["...", "..."], '
                 '"dependencies": "...", "pitfalls": "...", "lessons": "..."}')
MAX_KEY_STEPS = 6

NOTE = ("A plan drawn from an earlier attempt (follow it, but compute every value "
        "yourself):\n{plan}")

# Lines that give the answer away; the plan must carry the method, not the result.
_LEAKS = re.compile(r"\\boxed|final answer|the answer is|answer\s*[:=]", re.I)


def clean_plan(text: str) -> tuple[str, int]:
    """The plan without lines that state an answer, and how many lines were dropped."""
    lines = text.strip().splitlines()
    kept = [ln for ln in lines if not _LEAKS.search(ln)]
    return "\n".join(kept).strip(), len(lines) - len(kept)


def has_headings(text: str) -> bool:
    """Whether a free-text plan carries every heading ABSTRACT asks for."""
    low = text.lower()
    return all(f"{label.lower()}:" in low for _, label in HEADINGS)


@lru_cache(maxsize=16)
def plan_schema(plan_tokens: int) -> Constraint:
    """JSON with one non-empty string per heading and 1..6 key steps.

    The strings are capped so the whole plan stays near ``plan_tokens`` tokens (at
    about four characters a token): it ends inside its token cap, not cut mid-JSON.
    """
    chars = 4 * plan_tokens
    text = {"type": "string", "minLength": 1, "maxLength": max(16, chars // 8)}
    step = {"type": "string", "minLength": 1, "maxLength": max(16, chars // 16)}
    props = {key: text for key, _ in HEADINGS}
    props["key_steps"] = {"type": "array", "items": step, "minItems": 1,
                          "maxItems": MAX_KEY_STEPS}
    schema = {"type": "object", "additionalProperties": False,
              "required": [key for key, _ in HEADINGS], "properties": props}
    return Constraint.from_schema(schema, name="plan")


def render_plan(text: str) -> str | None:
    """The headed plan text of a JSON plan reply; None when it is not one."""
    try:
        data = parse_json_object(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or any(key not in data for key, _ in HEADINGS):
        return None
    lines = []
    for key, label in HEADINGS:
        value = data[key]
        if isinstance(value, list):
            lines += [f"{label}:", *(f"{i}. {v}" for i, v in enumerate(value, 1))]
        else:
            lines.append(f"{label}: {value}")
    return "\n".join(lines)


class PlanNote(Detail):
    """The plan a rollout followed (None for the first rollout), lifted into the result."""

    plan: str | None = None
    plan_dropped_lines: int | None = None


class SAGE(LoopStrategy):
    """``sage(inner, rounds=1, plan_tokens=300)``: re-solve with an abstracted plan.

    The inner strategy makes a first rollout; the model abstracts it into a
    plan (goal, knowns, ordered key steps, dependencies, pitfalls, lessons
    from the attempt; no final answer, no computed results; at most
    ``plan_tokens`` tokens, lines stating an answer are dropped); the inner
    strategy runs again on the task with the plan added to the question. The
    last rollout is returned and gets the caller's context, so at the root its
    text streams to the client.

    ``structured`` (refinery's addition; default: when the backend enforces JSON
    schemas) asks for the plan as JSON, one key per heading
    (:func:`plan_schema`, strings capped to stay near ``plan_tokens``), and
    renders it back to the same headed text before the leak filter; a reply
    that is not such JSON is used as free text. ``structured=False`` is the
    free-text plan. The plan's trace event notes whether it parsed (JSON with
    every key; in free text, every heading present).

    Example:
        >>> attempt = await SAGE(CoT()).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["plan"][:40]  # doctest: +SKIP
        'Goal: the number of apples left after...'
    """

    name = "sage"
    keep = "last"
    min_inner = max_inner = 1
    default_inner = (CoT,)
    structured_kinds = frozenset({"json"})

    class Params(StructuredParams):
        rounds: int = Field(1, ge=1, le=4, description="plan -> rollout rounds")
        plan_tokens: int = Field(300, ge=32, le=1024, description="plan length cap")
        temperature: float = Field(0.0, ge=0.0, le=2.0, description="plan temperature")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return children[0].calls * (params.rounds + 1) + params.rounds

    def rounds(self) -> int:
        return self.params.rounds + 1

    async def score(self, task: Task, ctx: Context, cands: list[Attempt]) -> list[Scored[PlanNote]]:
        # No scoring: SAGE keeps the last rollout; lift the plan into the result's metadata.
        return [Scored(a, detail=PlanNote(plan=a.metadata.get("plan"),
                                          plan_dropped_lines=a.metadata.get("plan_dropped_lines")))
                for a in cands]

    async def propose(self, task: Task, ctx: Context, rnd: int,
                      last: list[Scored[PlanNote]]) -> list[Attempt]:
        inner = self.inner[0]
        if rnd == 0:
            return [await inner.solve(task, ctx.inner())]
        [prev] = last
        plan, dropped, eid = await self.abstract(task, ctx, prev.attempt)
        planned = with_note(task, NOTE.format(plan=plan)) if plan else task
        # Only the last rollout is the answer: it alone gets the caller's context.
        final = rnd == self.params.rounds
        attempt = await inner.solve(planned, ctx if final else ctx.inner())
        return [attempt.model_copy(update={
            "events": [*attempt.events, eid],
            "metadata": {**attempt.metadata, "plan": plan, "plan_dropped_lines": dropped}})]

    async def abstract(self, task: Task, ctx: Context, prev: Attempt) -> tuple[str, int, str]:
        """(plan, lines dropped as leaks, plan event id) drawn from the rollout ``prev``."""
        structured = self.structured(ctx)
        prompt = ABSTRACT.format(question=task.question, attempt=prev.text,
                                 words=int(self.params.plan_tokens * 0.75))
        if structured:
            prompt = f"{prompt}\n{ABSTRACT_JSON}"
        params = step_params(ctx, plan_schema(self.params.plan_tokens) if structured else None,
                             temperature=self.params.temperature,
                             max_tokens=self.params.plan_tokens)
        gen = await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                 step="plan", strategy=self.name, parents=prev.events)
        text = gen[0].text
        rendered = render_plan(text) if structured else None
        parsed = rendered is not None if structured else has_headings(text)
        record_parse(ctx, gen.event_id, "plan", [parsed], structured=structured)
        plan, dropped = clean_plan(rendered or text)
        eid = ctx.emit("plan", plan, strategy=self.name, parents=[gen.event_id],
                       dropped_lines=dropped)
        return plan, dropped, eid
