"""GenSelect: the model reads n candidates side by side and picks the best one."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from refinery.engine.constraints import Constraint
from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Message, Task
from refinery.strategies.base import (
    PartialAttempts,
    Strategy,
    StructuredParams,
    exc_message,
    record_parse,
    step_params,
)
from refinery.strategies.cot import CoT, sample_inner
from refinery.strategies.moa import show
from refinery.strategies.self_consistency import answer_groups
from refinery.strategies.spec import ChildCost
from refinery.verifiers.judge import EXPLAIN_CHARS, grade_pattern

COMPARE = """Several drafts answer the problem below.

Problem:
{question}

{drafts}

Compare the drafts: check each one's reasoning and final answer in a short paragraph. \
Then name the single best draft on a last line "Best: N", N between 1 and {n}."""

# "Best: 3", "best draft is 3", "Best candidate: #2": the pick line, the last one wins.
PICK = re.compile(r"\bbest(?:\s+(?:draft|candidate|solution|response))?\s*(?:is|:|=)?\s*"
                  r"(?:draft|candidate)?\s*#?\s*(\d+)", re.IGNORECASE)


def compare_form(n: int) -> Constraint:
    """Structured mode: one paragraph comparing the drafts, then ``Best: 1..n``."""
    return Constraint.from_regex(f"[^\\n]{{1,{EXPLAIN_CHARS}}}\\nBest: {grade_pattern(1, n)}")


@dataclass(frozen=True)
class Pick:
    """The chosen draft (0-based) and how: ``parsed`` from the reply, or a ``fallback``
    (the most common answer, the first draft on ties or with no answers) and why."""

    index: int
    how: str
    reason: str | None = None


def parse_pick(text: str, drafts: Sequence[Attempt]) -> Pick:
    """The draft a comparison names (its last in-range ``Best: N``), else the fallback.

    Example:
        >>> from refinery.engine.types import Attempt
        >>> drafts = [Attempt(text="a", answer="4"), Attempt(text="b", answer="5")]
        >>> parse_pick("Draft 2 checks out.\\nBest: 2", drafts)
        Pick(index=1, how='parsed', reason=None)
        >>> parse_pick("Both look fine.", drafts).how
        'fallback'
    """
    picks = [int(m) for m in PICK.findall(text)]
    valid = [k for k in picks if 1 <= k <= len(drafts)]
    if valid:
        return Pick(valid[-1] - 1, "parsed")
    reason = f"pick {picks[-1]} out of 1..{len(drafts)}" if picks else "no pick in the reply"
    return majority(drafts, reason)


def majority(drafts: Sequence[Attempt], reason: str) -> Pick:
    """The first draft of the most common answer (first seen on ties)."""
    _, groups = answer_groups(drafts)
    if not groups:
        return Pick(0, "fallback", f"{reason}; no draft has an answer: the first")
    best = max(groups.values(), key=len)
    tied = sum(len(g) == len(best) for g in groups.values()) > 1
    return Pick(best[0], "fallback", f"{reason}; majority answer"
                + (" (tied: first seen)" if tied else ""))


class GenSelect(Strategy):
    """``genselect(inner, n=4)``: n drafts, one comparison of them all, its pick returned.

    For open-ended answers no vote can group: (1) ``n`` drafts from the inner
    strategy (a cot inner samples them in ONE request at ``temperature``); (2) one
    request shows the problem and every draft, numbered, and asks for a comparison
    ending ``Best: N``. In structured mode (default: when the backend enforces
    regexes) the reply is one paragraph then ``Best: 1..n``, so the pick is always a
    valid draft; free text is parsed for its last in-range pick. An unreadable or
    out-of-range pick falls back to the draft with the most common answer (the
    first draft on ties or when none has an answer), and the ``select`` trace event
    and the metadata say so (``pick_how``, ``fallback``). A budget spent before the
    comparison falls back the same way, with ``budget_exhausted``. A turn whose
    answer may be a tool call runs as its inner strategy's tool-turn form (drafts
    that are calls are not compared here).

    Source: OptiLLM's ``genselect`` approach (after Toshniwal et al. 2025,
    "GenSelect: A Generative Approach to Best-of-N").

    Example:
        >>> attempt = await GenSelect(CoT(), n=4).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["pick"], attempt.metadata["pick_how"]  # doctest: +SKIP
        (2, 'parsed')
    """

    name = "genselect"
    min_inner = max_inner = 1
    default_inner = (CoT,)
    structured_kinds = frozenset({"regex"})

    class Params(StructuredParams):
        n: int = Field(4, ge=2, le=8, description="drafts compared")
        temperature: float = Field(0.7, ge=0.0, le=2.0, description="draft temperature (cot)")
        select_temperature: float = Field(0.0, ge=0.0, le=2.0,
                                          description="temperature of the comparison")
        compare_tokens: int = Field(512, ge=32, le=2048, description="comparison length cap")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        [inner] = children
        return (inner.calls if inner.one_request else params.n * inner.calls) + 1

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        structured = self.structured(ctx)  # structured=True without support: fail first
        try:
            drafts = await sample_inner(self.inner[0], task, ctx, self.params.n,
                                        temperature=self.params.temperature)
        except PartialAttempts as exc:
            if not exc.attempts:
                raise
            return self.chosen(ctx, exc.attempts, majority(exc.attempts, "budget"), [],
                               spent=exc)
        try:
            pick, events = await self.compare(task, ctx, drafts, structured)
        except BudgetExhausted as exc:
            return self.chosen(ctx, drafts, majority(drafts, "budget"), [], spent=exc)
        return self.chosen(ctx, drafts, pick, events)

    async def compare(self, task: Task, ctx: Context, drafts: list[Attempt],
                      structured: bool) -> tuple[Pick, list[str]]:
        prompt = COMPARE.format(question=task.question, drafts=show(drafts), n=len(drafts))
        params = step_params(ctx, compare_form(len(drafts)) if structured else None,
                             temperature=self.params.select_temperature,
                             max_tokens=min(ctx.params.max_tokens, self.params.compare_tokens))
        gen = await ctx.generate([Message(role="user", content=prompt)], params, n=1,
                                 step="judge", strategy=self.name,
                                 parents=[e for d in drafts for e in d.events])
        pick = parse_pick(gen[0].text, drafts)
        record_parse(ctx, gen.event_id, "select", [pick.how == "parsed"], structured=structured)
        return pick, [gen.event_id]

    def chosen(self, ctx: Context, drafts: list[Attempt], pick: Pick, events: list[str],
               spent: BudgetExhausted | None = None) -> Attempt:
        """The picked draft as this strategy's answer, with its ``select`` event."""
        draft = drafts[pick.index]
        eid = ctx.emit("select", draft.answer or "", strategy=self.name,
                       parents=[*draft.events, *events], pick=pick.index + 1, how=pick.how,
                       fallback=pick.reason, candidates=len(drafts))
        meta = {**draft.metadata, "drafts": len(drafts), "pick": pick.index + 1,
                "pick_how": pick.how, "draft_answers": [d.answer for d in drafts],
                **({"fallback": pick.reason} if pick.reason else {}),
                **({"budget_exhausted": exc_message(spent)} if spent is not None else {})}
        return draft.model_copy(update={"strategy": self.name, "events": [eid],
                                        "metadata": meta})
