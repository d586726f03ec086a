"""Helpers shared by the strategy tests (the scripted backend does the talking)."""

from __future__ import annotations

import asyncio

from refinery.engine.context import Budget, Context
from refinery.engine.types import Task
from tests.scripted_backend import ScriptedBackend

QUESTION = "Tom has 3 apples and buys 4 more. Then the pile doubles. How many apples now?"


def task(question: str = QUESTION) -> Task:
    return Task.from_prompt(question, id="t1")


def ctx(backend: ScriptedBackend, *, max_calls: int | None = None, **kwargs) -> Context:
    return Context(backend, task=task(), budget=Budget(max_calls=max_calls), **kwargs)


def prompts(backend: ScriptedBackend, marker: str) -> list:
    """The recorded calls whose joined prompt contains ``marker``."""
    return [c for c in backend.calls if marker in "\n".join(m.content for m in c.messages)]


class ProbeBackend(ScriptedBackend):
    """Scripted backend that yields to the loop inside each call and records how many
    calls were in flight at once (to prove concurrent batching)."""

    def __init__(self, rules):
        super().__init__(rules)
        self.inflight = 0
        self.peak = 0

    async def generate(self, messages, params, *, n=None, stop_rule=None):
        self.inflight += 1
        self.peak = max(self.peak, self.inflight)
        # Zero-delay yields, not a timer: the interleaving is the same on a loaded machine.
        for _ in range(20):
            await asyncio.sleep(0)
        try:
            return await super().generate(messages, params, n=n, stop_rule=stop_rule)
        finally:
            self.inflight -= 1


class StrictBackend(ScriptedBackend):
    """Scripted backend that answers as an enforcing engine would: every sample of a
    constrained call must satisfy the call's constraint, or the test fails (so the
    scripted replies, and the strategies' constraints, are checked against each other)."""

    def _completion(self, messages, params, i):
        comp = super()._completion(messages, params, i)
        c = params.constraint
        assert c is None or c.accepts(comp.text), (c, comp.text)
        return comp


def constraints(backend: ScriptedBackend, marker: str) -> list:
    """The constraint of each recorded call whose prompt contains ``marker``."""
    return [c.params.constraint for c in prompts(backend, marker)]


def parse_records(context: Context) -> list[tuple[str, str, list[bool], bool]]:
    """(strategy, step, parsed, structured) of every parse note in the trace, in order."""
    return [(e.strategy, e.data["parse"]["step"], e.data["parse"]["parsed"],
             e.data["parse"]["structured"])
            for e in context.trace.events if "parse" in e.data]
