"""Signals: how sure a finished attempt is, the test a cascade reads before it spends more.

A signal is named in a spec as a bare name or a call with one number
(``ran``, ``margin(2)``, ``"confidence(9.5)"``): :data:`SIGNALS` maps each name
to its class, and :data:`SignalSpec` checks a spec's ``until=`` against it when
the spec is parsed (the step scorers' :class:`~refinery.verifiers.steps.RegisteredName`
mechanism, so ``refinery strategies`` lists the names). A reading compares the
signal's value with its threshold; no value (nothing to read: no vote, no run,
not measured) is never sure.

- ``ran``: a program ran and printed the attempt's answer (pot, tir; a vote over
  them): an ``execute`` event of its trace, ok, under its generations;
- ``margin(k)``: the vote's leader has at least ``k`` more votes than the runner-up;
- ``confidence(x)``: DeepConf's lowest group confidence of the answer's sample is at
  least ``x`` (engine/confidence.py; the stage runs under a measuring rule);
- ``verified``: the task's visible checks pass (self_debug's examples, or the
  task's label-free verifier, e.g. ``code`` with tests shipped with the prompt);
- ``score(x)``: the attempt's score (its scorer's, or a vote's share) is at least ``x``.

Example:
    >>> build_signal("margin(2)"), build_signal("ran").threshold
    (Margin(threshold=2.0), None)
    >>> build_signal("margin(0)")
    Traceback (most recent call last):
    ...
    ValueError: margin(k) needs k >= 1, got 0
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import AfterValidator

from refinery.engine.confidence import ConfidenceRule
from refinery.engine.context import Context
from refinery.engine.errors import RefineryError
from refinery.engine.stops import AnyRule
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Attempt, Task
from refinery.verifiers.math import normalize_answer
from refinery.verifiers.registry import get_verifier
from refinery.verifiers.steps import RegisteredName

__all__ = ["SIGNALS", "Reading", "Signal", "SignalSpec", "build_signal"]

Value = bool | float | None


@dataclass(frozen=True)
class Reading:
    """One signal read on one attempt: its value, the threshold it needs (None: the value
    must be True), whether that makes the attempt sure, and why there is no value."""

    signal: str
    value: Value
    threshold: float | None
    sure: bool
    why: str = ""

    def text(self) -> str:
        """``margin(2): 1 (needs >= 2)``, as the trace shows it."""
        needs = "True" if self.threshold is None else f">= {self.threshold:g}"
        shown = self.why or (f"{self.value:g}" if isinstance(self.value, float)
                             else str(self.value))
        return f"{self.signal}: {shown} (needs {needs})"


@dataclass(frozen=True)
class Signal:
    """Base: ``threshold`` is the number of the spec's call (None for a bare signal)."""

    name: ClassVar[str] = ""
    number: ClassVar[str | None] = None  # what the number is ("k"); None: it takes none
    low: ClassVar[float] = 0.0  # the smallest number accepted
    threshold: float | None = None

    def __post_init__(self) -> None:
        if self.number is None and self.threshold is not None:
            raise ValueError(f"{self.name} takes no number (write {self.name})")
        if self.number is not None and self.threshold is None:
            raise ValueError(f"{self.name} needs a number: {self.name}({self.number})")
        if self.threshold is not None and self.threshold < self.low:
            raise ValueError(f"{self.name}({self.number}) needs {self.number} >= "
                             f"{self.low:g}, got {self.threshold:g}")

    @property
    def spec(self) -> str:
        return self.name if self.threshold is None else f"{self.name}({self.threshold:g})"

    def view(self, ctx: Context) -> Context:
        """The context the stages run in (one that measures what the signal reads)."""
        return ctx

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        """The value, and why there is none when it is None."""
        raise NotImplementedError

    async def read(self, task: Task, attempt: Attempt, ctx: Context) -> Reading:
        value, why = await self.value(task, attempt, ctx)
        if self.threshold is None:
            sure = value is True
        else:
            sure = value is not None and value >= self.threshold
        return Reading(self.spec, value, self.threshold, sure, why)


class Ran(Signal):
    name = "ran"

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        if attempt.answer is None:
            return False, ""
        key = normalize_answer(attempt.answer)
        mine = ancestry(ctx.trace, attempt.events)
        for event in ctx.trace.events:
            if event.step != "execute" or not event.data.get("ok"):
                continue
            printed = event.data.get("answer")  # tir's runs print steps, not the answer
            if mine.intersection(event.parents) and (
                    printed is None or normalize_answer(str(printed)) == key):
                return True, ""
        return False, ""


class Margin(Signal):
    name, number, low = "margin", "k", 1.0

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        votes = attempt.metadata.get("votes")
        if not isinstance(votes, dict) or not votes:
            return None, "no vote"
        ranked = sorted(votes.values(), reverse=True) + [0]
        return float(ranked[0] - ranked[1]), ""


class Confidence(Signal):
    name, number = "confidence", "x"
    window: ClassVar[int] = 32  # DeepConf's window here (strategies/deepconf.py)

    def view(self, ctx: Context) -> Context:
        return ctx.fork(stop_rule=AnyRule.of(ctx.stop_rule, ConfidenceRule(window=self.window)))

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        measured = [(attempt.metadata.get("measures") or {}).get("confidence")]
        for event in events_of(ctx.trace, ancestry(ctx.trace, attempt.events)):
            measured += [(c.measures or {}).get("confidence") for c in event.completions or ()
                         if c.text == attempt.text]
        found = [float(c) for c in measured if c is not None]
        return (found[0], "") if found else (None, "not measured (no logprobs)")


class Verified(Signal):
    name = "verified"

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        examples = attempt.metadata.get("examples")
        if examples:  # self_debug ran the prompt's own examples
            return attempt.metadata.get("examples_passed") == examples, ""
        if task.verifier is None:
            return None, "nothing to check against"
        try:
            verdict = await get_verifier(task.verifier).verify(task, attempt.text)
        except RefineryError as exc:  # e.g. a code task without tests
            return None, f"{task.verifier}: {exc.message}"
        return verdict.passed, ""


class Score(Signal):
    name, number = "score", "x"

    async def value(self, task: Task, attempt: Attempt, ctx: Context) -> tuple[Value, str]:
        return (None, "not scored") if attempt.score is None else (attempt.score, "")


# name -> signal class, in the order error messages list them.
SIGNALS: dict[str, type[Signal]] = {s.name: s for s in (Ran, Margin, Confidence, Verified,
                                                        Score)}


def build_signal(text: str) -> Signal:
    """The signal a spec names: ``name`` or ``name(number)``.

    Raises:
        ValueError: unknown name (the message lists the registered ones), a number
            where none is taken, none where one is needed, one out of range.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        node = None
    if isinstance(node, ast.Name):
        name, args = node.id, []
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and not node.keywords):
        name, args = node.func.id, node.args
    else:
        raise ValueError(f"a signal is a name or a name with one number, e.g. margin(2); "
                         f"got {text!r}")
    cls = SIGNALS.get(name)
    if cls is None:
        raise ValueError(f"unknown signal {name!r}; known: {', '.join(SIGNALS)}")
    if len(args) > 1 or (args and not _is_number(args[0])):
        raise ValueError(f"{name} takes one number at most, e.g. {name}(2); got {text!r}")
    return cls(float(ast.literal_eval(args[0])) if args else None)


def _is_number(node: ast.expr) -> bool:
    value = node.value if isinstance(node, ast.Constant) else None
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, eq=False)  # identity hash, as RegisteredName's
class RegisteredSignal(RegisteredName):
    """A spec's signal checked when the spec is parsed: its name registered, its number
    valid."""

    def __call__(self, text: str) -> str:
        build_signal(text)
        return text


SignalSpec = Annotated[str, AfterValidator(RegisteredSignal(SIGNALS, "signal"))]
"""A strategy parameter naming a signal (``ran``, ``margin(2)``): checked when parsed."""


def ancestry(trace: Trace, ids: Iterable[str]) -> set[str]:
    """``ids`` and every event they descend from (their parents, theirs, ...)."""
    parents = {e.id: e.parents for e in trace.events}
    seen: set[str] = set()
    todo = list(ids)
    while todo:
        eid = todo.pop()
        if eid not in seen:
            seen.add(eid)
            todo += parents.get(eid, [])
    return seen


def events_of(trace: Trace, ids: set[str]) -> list[TraceEvent]:
    return [e for e in trace.events if e.id in ids]

