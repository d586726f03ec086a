"""Step scorers: process rewards for partial solutions, the signal step search spends.

A partial solution is a list of steps (the text between blank lines). A scorer
gives each step of each partial solution a score in [0, 1]: how likely the
solution is still right after that step. A search scores many partial
solutions at once (every beam of a level), so the protocol takes a batch: a
judge sends them to the engine together, a programmatic check runs them in
turn. :func:`aggregate` folds one path's step scores into one number, as
search-and-learn and its_hub do (``last``, ``min``, ``prod``, ``mean``).

Scorers see the task, never its gold answer: they run at solve time.

Example:
    >>> aggregate([0.9, 0.5, 0.8], "min")
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

from refinery.engine.context import Context
from refinery.engine.errors import SpecError
from refinery.engine.types import Task

__all__ = ["AGGREGATIONS", "SCORERS", "Aggregation", "StepScorer", "aggregate", "build_scorer"]

Aggregation = Literal["last", "min", "prod", "mean"]
AGGREGATIONS: tuple[Aggregation, ...] = ("last", "min", "prod", "mean")


@runtime_checkable
class StepScorer(Protocol):
    """Scores every step of every partial solution of one task."""

    name: str

    async def score(self, task: Task, paths: Sequence[Sequence[str]],
                    ctx: Context) -> list[list[float]]:
        """``result[i][j]``: the score in [0, 1] of step ``j`` of ``paths[i]``."""
        ...


def aggregate(scores: Sequence[float], how: Aggregation = "last") -> float:
    """One path's step scores as one number; an empty path scores 1 (nothing wrong yet)."""
    if not scores:
        return 1.0
    if how == "last":
        return scores[-1]
    if how == "min":
        return min(scores)
    if how == "prod":
        return math.prod(scores)
    return sum(scores) / len(scores)


def _arith() -> StepScorer:
    from refinery.verifiers.step_arith import ArithStepScorer
    return ArithStepScorer()


def _judge() -> StepScorer:
    from refinery.verifiers.step_judge import JudgeStepScorer
    return JudgeStepScorer()


# name -> a new scorer. A search builds its own for every solve, so a scorer may
# keep what it already scored of this solve (a judge's earlier steps) and nothing else.
SCORERS: dict[str, Callable[[], StepScorer]] = {"arith": _arith, "judge": _judge}


def build_scorer(name: str) -> StepScorer:
    """A new scorer by name.

    Raises:
        SpecError: no scorer has that name.
    """
    make = SCORERS.get(name)
    if make is None:
        raise SpecError(f"unknown step scorer {name!r}; known: {', '.join(sorted(SCORERS))}",
                        param="scorer")
    return make()
