"""A task's trace as the explorer shows it: a tree of calls and steps, and the budget.

The provenance DAG is drawn as a tree, each event under its first parent (as
``refinery trace show`` does); its other parents are listed on it. The events
that made the answer are marked ``answer``, and the candidates the answer's
``select`` steps chose (their parents, followed through nested selects) are
marked ``chosen``. Texts stay text: the template escapes every one of them.

Building the view is linear in the events (a union-find keeps the tree a tree,
whatever cycles a file's parents make) and nothing recurses, here or in the
template: the tree reaches the page as :class:`TreeRow` s in page order, each
saying how many levels it closes. A trace of more than :data:`MAX_EVENTS`
events is shown without its tree, with a note saying so.

Example:
    >>> view = trace_view(trace, Budget(max_calls=8))  # a trace of 3 calls  # doctest: +SKIP
    >>> [(b.name, b.used, b.limit) for b in view.budget][0]  # doctest: +SKIP
    ('calls', 3, 8)
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pydantic import BaseModel, Field

from refinery.engine.context import Budget
from refinery.engine.errors import RefineryError
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Message
from refinery.strategies.registry import build_with_graph
from refinery.strategies.spec import worst_case_calls

SHOWN_DATA_SCORES = ("score", "total", "votes")  # the data keys shown in a step's header
MAX_EVENTS = 5000  # the most events whose tree the page draws (bench/ui_load.py times it)


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


class TreeRow(BaseModel):
    """One event of the tree in page order: ``opens`` when its children follow (its
    list item stays open), ``closes`` the levels that end after it."""

    call: CallView
    opens: bool = False
    closes: int = 0


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
    rows: list[TreeRow] = Field(default_factory=list)
    too_many: str | None = None


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
    n = len(trace.events)
    roots = call_tree(trace) if n <= MAX_EVENTS else []
    too_many = None if n <= MAX_EVENTS else (
        f"This trace has {n:,} events; the explorer draws the tree of traces of up to "
        f"{MAX_EVENTS:,}. `refinery trace show FILE --task ID` prints it whole.")
    return TraceView(
        task_id=trace.task_id, question=trace.task.question if trace.task else None,
        gold=trace.task.gold if trace.task else None, strategy=trace.strategy,
        model=trace.model, answer=att.answer if att else None, text=att.text if att else None,
        error=trace.error, events=n, budget=budget, roots=roots, rows=tree_rows(roots),
        too_many=too_many,
        loops=sum(o.finish_reason == "loop" for e in trace.events for o in e.completions or []))


def spec_worst_case(spec: str) -> int | None:
    """The worst-case calls of a trace's strategy spec (None: not a spec, e.g. passthrough)."""
    try:
        _, g = build_with_graph(spec, max_calls=None)
    except RefineryError:
        return None
    return worst_case_calls(g)


def call_tree(trace: Trace) -> list[CallView]:
    """The events as a forest: each under its first known parent, in trace order, unless
    that would close a cycle (then it is a root). A parent id names the first event
    with that id."""
    events = trace.events
    first: dict[str, int] = {}
    for i, e in enumerate(events):
        first.setdefault(e.id, i)
    answer = set(trace.attempt.events) if trace.attempt else set()
    chosen = chosen_events(events, answer)
    views = [call_view(e, answer, chosen) for e in events]
    forest = Forest(len(events))
    roots = []
    for i, e in enumerate(events):
        parents = _dedupe(p for p in e.parents if p in first and p != e.id)
        views[i].also_from = parents[1:]
        if parents and forest.attach(i, first[parents[0]]):
            views[first[parents[0]]].children.append(views[i])
        else:
            roots.append(views[i])
    return roots


class Forest:
    """Trees over nodes ``0..n-1`` joined one edge at a time, refusing an edge that
    would close a cycle: a union-find (path halving, union by size), so ``n`` joins
    take about linear time, where walking up the tree for each would be quadratic."""

    def __init__(self, n: int):
        self.up = list(range(n))
        self.size = [1] * n

    def find(self, x: int) -> int:
        up = self.up
        while up[x] != x:
            up[x] = up[up[x]]
            x = up[x]
        return x

    def attach(self, child: int, parent: int) -> bool:
        """Hang ``child`` (the root of its tree) under ``parent``; False, and nothing
        changed, when ``parent`` is in ``child``'s own tree."""
        a, b = self.find(child), self.find(parent)
        if a == b:
            return False
        if self.size[a] > self.size[b]:
            a, b = b, a
        self.up[a] = b
        self.size[b] += self.size[a]
        return True


def tree_rows(roots: list[CallView]) -> list[TreeRow]:
    """The forest in page order (depth first), without recursion: each row says whether
    its children follow and how many open levels end after it."""
    rows: list[TreeRow] = []
    todo: list[tuple[CallView, bool]] = [(r, False) for r in reversed(roots)]
    while todo:
        node, leaving = todo.pop()
        if leaving:
            rows[-1].closes += 1
            continue
        rows.append(TreeRow(call=node, opens=bool(node.children)))
        if node.children:
            todo.append((node, True))
            todo.extend((c, False) for c in reversed(node.children))
    return rows


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
