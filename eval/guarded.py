"""A strategy as an eval runs it: built from its spec, its bugs recorded per problem.

Shared by the local runner and the Ray actors (``refinery.eval.ray_pool``), so a
problem fails the same way wherever it runs.

Example:
    >>> strategy, graph = build_strategy("sc(cot, n=4)")
    >>> guarded = Guarded(strategy)  # a ValueError inside solve() -> StrategyCrash
"""

from __future__ import annotations

import asyncio
from typing import Any

import networkx as nx

from refinery.engine.context import Context
from refinery.engine.errors import RefineryError
from refinery.engine.types import Attempt, Task

__all__ = ["Guarded", "StrategyCrash", "build_strategy"]


class StrategyCrash(RefineryError):
    """A strategy raised something other than a RefineryError (a bug); recorded per problem."""


class Guarded:
    """Turns a strategy's non-Refinery exception (a bug) into a recorded per-problem error,
    so one bad problem does not end a 200-problem run (and its resume) every time."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        try:
            return await self.inner.solve(task, ctx)
        except (RefineryError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise StrategyCrash(f"{type(exc).__name__}: {exc}") from exc


def build_strategy(spec: str) -> tuple[Any, nx.DiGraph]:
    """``(strategy, validated graph)`` for a spec, via the strategies registry.

    Raises:
        SpecError, BudgetError: a bad spec.
    """
    from refinery.strategies import build_with_graph

    return build_with_graph(spec)
