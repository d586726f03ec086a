"""Cascade: run a cheap strategy first, a costlier one only when a signal is unsure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import Strategy, StrategyParams, dedupe, exc_message
from refinery.strategies.self_consistency import Seedable
from refinery.strategies.signals import Reading, SignalSpec, build_signal
from refinery.strategies.spec import ChildCost


@dataclass(frozen=True)
class Stage:
    """One stage that ran: its place (1-based), strategy and attempt."""

    number: int
    strategy: Strategy
    attempt: Attempt


class Cascade(Strategy):
    """``cascade(a, b, ..., until=ran)``: each stage only when the one before was unsure.

    Stage ``a`` runs; when the signal (strategies/signals.py: ``ran``,
    ``margin(k)``, ``confidence(x)``, ``verified``, ``score(x)``) is sure of
    its attempt, that attempt is kept and the later stages never run; else ``b``
    runs, and so on. The last stage's attempt is kept whatever the signal says.
    A later stage that is a vote (``sc``, ``asc``) over the same strategy as an
    earlier stage counts that stage's attempt as one of its samples and draws
    the rest, so ``cascade(pot, sc(pot, n=4))`` draws 4 programs, not 5, when it
    escalates. Every reading is traced (a ``threshold`` event: the signal, its
    value, its threshold, the stage entered or not) and kept in the result's
    ``metadata["checks"]`` (``stopped``: ``sure``, ``last`` or ``budget``). Worst
    case: every stage runs (the sum of theirs). A budget spent in a later stage
    keeps the last stage that finished.

    On a turn whose answer may be a tool call it runs as its first stage's
    tool-turn form (strategies/registry.py ``tool_turn_form``).

    Greedy ``pot`` solves 19.5% of arith at 346 tokens, ``sc(pot, n=8)`` 12.5%
    at 3,129 (docs/results.md): a program that ran is the sign an answer is
    worth keeping, and the vote is paid for only when none did.

    Example:
        >>> from refinery.strategies.pot import ProgramOfThought
        >>> from refinery.strategies.self_consistency import SelfConsistency
        >>> c = Cascade(ProgramOfThought(), SelfConsistency(ProgramOfThought(), n=4))
        >>> c.params.until
        'ran'
        >>> attempt = await c.solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["stage"], attempt.metadata["checks"][0]["sure"]  # doctest: +SKIP
        (1, True)
    """

    name = "cascade"
    min_inner, max_inner = 2, None

    class Params(StrategyParams):
        """Which signal makes a stage's attempt final."""

        until: SignalSpec = Field("ran", description="the signal that keeps a stage's "
                                  "attempt: ran, margin(k), confidence(x), verified, score(x)")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        return sum(child.calls for child in children)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        signal = build_signal(self.params.until)
        view = signal.view(ctx.inner())
        ran: list[Stage] = []
        checks: list[dict[str, Any]] = []
        stopped, spent = "last", None
        for number, strategy in enumerate(self.inner, 1):
            try:
                attempt = await with_prior(strategy, ran).solve(task, view)
            except BudgetExhausted as exc:
                if not ran:
                    raise
                stopped, spent = "budget", exc
                break
            ran.append(Stage(number, strategy, attempt))
            if number == len(self.inner):
                break
            reading = await signal.read(task, attempt, view)
            checks.append(self.trace_check(ctx, ran[-1], reading))
            if reading.sure:
                stopped = "sure"
                break
        return self.result(ctx, ran[-1], checks, stopped, spent)

    def trace_check(self, ctx: Context, stage: Stage, reading: Reading) -> dict[str, Any]:
        """Trace why the next stage is entered or not; the check as metadata keeps it."""
        record = {"stage": stage.number, "signal": reading.signal, "value": reading.value,
                  "threshold": reading.threshold, "sure": reading.sure,
                  **({"why": reading.why} if reading.why else {})}
        went = "not entered" if reading.sure else "entered"
        ctx.emit("threshold", f"stage {stage.number} {stage.strategy!r}: {reading.text()}; "
                 f"stage {stage.number + 1} {self.inner[stage.number]!r} {went}",
                 strategy=self.name, parents=dedupe(stage.attempt.events), **record)
        return record

    def result(self, ctx: Context, stage: Stage, checks: list[dict[str, Any]], stopped: str,
               spent: BudgetExhausted | None) -> Attempt:
        meta: dict[str, Any] = {**stage.attempt.metadata, "stage": stage.number,
                                "stages": len(self.inner), "checks": checks,
                                "stopped": stopped}
        if spent is not None:
            meta["budget_exhausted"] = exc_message(spent)
        eid = ctx.emit("select", stage.attempt.answer or "", strategy=self.name,
                       parents=dedupe(stage.attempt.events), score=stage.attempt.score,
                       stage=stage.number, stopped=stopped)
        return stage.attempt.model_copy(update={
            "strategy": self.name, "events": [eid], "metadata": meta})


def with_prior(strategy: Strategy, ran: Sequence[Stage]) -> Strategy:
    """``strategy``, seeded with the attempts of earlier stages that ran its inner
    strategy (same spec), when it is a vote that takes them."""
    if not isinstance(strategy, Seedable) or not strategy.inner:
        return strategy
    same = repr(strategy.inner[0])
    prior = [s.attempt for s in ran if repr(s.strategy) == same]
    return strategy.seeded(prior) if prior else strategy

