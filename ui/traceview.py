"""A task's trace as the explorer shows it: a tree of calls and steps, and the budget.

The provenance DAG is drawn as a tree, each event under its first parent (as
``refinery trace show`` does); its other parents are listed on it. The events
that made the answer are marked ``answer``, and the candidates the answer's
``select`` steps chose (their parents, followed through nested selects) are
marked ``chosen``. Texts stay text: the template escapes every one of them.

Example:
    >>> view = trace_view(trace, Budget(max_calls=8))
    >>> [(b.name, b.used, b.limit) for b in view.budget][0]
    ('calls', 3, 8)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pydantic import BaseModel, Field

from refinery.engine.context import Budget
from refinery.engine.errors import RefineryError
from refinery.engine.graph import worst_case_calls
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Message
from refinery.strategies.registry import build_with_graph

SHOWN_DATA_SCORES = ("score", "total", "votes")  # the data keys shown in a step's header


class Output(BaseModel):
    """One sample of a call."""

    text: str
    finish_reason: str
    tokens: int
    loop: bool


class CallView(BaseModel):
    """One event: a model call (``generation``) or a strategy step, with its children."""

    id: str
    kind: str
    role: str
    strategy: str
    also_from: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: list[str] = Field(default_factory=list)
    loop: bool = False
    messages: list[Message] = Field(default_factory=list)
    outputs: list[Output] = Field(default_factory=list)
    text: str | None = None
    scores: dict[str, str] = Field(default_factory=dict)
    data: str | None = None
    answer: bool = False
    chosen: bool = False
    children: list[CallView] = Field(default_factory=list)


class BudgetRow(BaseModel):
    """What the task used of one budget, against its limit (None: unlimited)."""

    name: str
    used: int | float
    limit: int | float | None = None
    worst_case: int | None = None


class TraceView(BaseModel):
    """What the explorer page shows of one trace."""

    task_id: str
    question: str | None = None
    gold: str | None = None
    strategy: str
    model: str
    answer: str | None = None
    text: str | None = None
    error: str | None = None
    events: int
    loops: int
    budget: list[BudgetRow]
    roots: list[CallView]


def trace_view(trace: Trace, limits: Budget | None = None,
               worst_case: int | None = None) -> TraceView:
    """The explorer's view of ``trace``; ``worst_case`` defaults to its spec's."""
    limits = limits or Budget()
    if worst_case is None:
        worst_case = spec_worst_case(trace.strategy)
    att, u = trace.attempt, trace.usage
    budget = [BudgetRow(name="calls", used=u.calls, limit=limits.max_calls,
                        worst_case=worst_case),
              BudgetRow(name="tokens", used=u.total_tokens, limit=limits.max_tokens),
              BudgetRow(name="seconds", used=round(trace.seconds, 2),
                        limit=limits.max_seconds)]
    return TraceView(
        task_id=trace.task_id, question=trace.task.question if trace.task else None,
        gold=trace.task.gold if trace.task else None, strategy=trace.strategy,
        model=trace.model, answer=att.answer if att else None, text=att.text if att else None,
        error=trace.error, events=len(trace.events), budget=budget, roots=call_tree(trace),
        loops=sum(o.finish_reason == "loop" for e in trace.events for o in e.completions or []))


def spec_worst_case(spec: str) -> int | None:
    """The worst-case calls of a trace's strategy spec (None: not a spec, e.g. passthrough)."""
    try:
        _, g = build_with_graph(spec, max_calls=None)
    except RefineryError:
        return None
    return worst_case_calls(g)


def call_tree(trace: Trace) -> list[CallView]:
    """The events as a forest: each under its first known parent, in trace order."""
    by_id = {e.id: e for e in trace.events}
    answer = set(trace.attempt.events) if trace.attempt else set()
    chosen = chosen_events(trace.events, answer)
    views = {e.id: call_view(e, answer, chosen) for e in trace.events}
    roots = []
    for e in trace.events:
        parents = _dedupe(p for p in e.parents if p in by_id and p != e.id)
        views[e.id].also_from = parents[1:]
        if parents and _is_ancestor_free(e.id, parents[0], by_id):
            views[parents[0]].children.append(views[e.id])
        else:
            roots.append(views[e.id])
    return roots


def _is_ancestor_free(eid: str, parent: str, by_id: dict[str, TraceEvent]) -> bool:
    """Whether hanging ``eid`` under ``parent`` keeps the tree a tree (no cycle back)."""
    seen, todo = set(), [parent]
    while todo:
        nid = todo.pop()
        if nid == eid:
            return False
        if nid in seen or nid not in by_id:
            continue
        seen.add(nid)
        todo += by_id[nid].parents[:1]
    return True


def chosen_events(events: list[TraceEvent], answer: set[str]) -> set[str]:
    """The candidates behind the answer: parents of its ``select`` steps, transitively."""
    by_id = {e.id: e for e in events}
    chosen, todo = set(), [eid for eid in answer if eid in by_id]
    while todo:
        e = by_id[todo.pop()]
        if e.step != "select":
            continue
        for p in e.parents:
            if p in by_id and p not in chosen:
                chosen.add(p)
                todo.append(p)
    return chosen


def call_view(e: TraceEvent, answer: set[str], chosen: set[str]) -> CallView:
    """One event's card: usage, finish reasons (loop stops marked), texts, scores, data."""
    outputs = [Output(text=c.text, finish_reason=c.finish_reason, tokens=c.completion_tokens,
                      loop=c.finish_reason == "loop") for c in e.completions or []]
    scores = {k: _short(e.data[k]) for k in SHOWN_DATA_SCORES if e.data.get(k) is not None}
    return CallView(
        id=e.id, kind=e.kind, role=e.step, strategy=e.strategy, seconds=round(e.seconds, 3),
        prompt_tokens=e.usage.prompt_tokens if e.usage else None,
        completion_tokens=e.usage.completion_tokens if e.usage else None,
        finish=sorted({o.finish_reason for o in outputs}), loop=any(o.loop for o in outputs),
        messages=e.messages or [], outputs=outputs, text=e.text, scores=scores,
        data=json.dumps(e.data, indent=2, ensure_ascii=False, default=str) if e.data else None,
        answer=e.id in answer, chosen=e.id in chosen)


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:79] + "…"


def _dedupe(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))
