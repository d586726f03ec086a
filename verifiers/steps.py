"""Step scorers: process rewards for partial solutions, the signal step search spends.

A partial solution is a list of steps (the text between blank lines). A scorer
gives each step of each partial solution a score in [0, 1]: how likely the
solution is still right after that step. A search scores many partial
solutions at once (every beam of a level), so the protocol takes a batch: a
judge sends them to the engine together, a process reward model reads them in
one request, a programmatic check runs them in turn. :func:`aggregate` folds
one path's step scores into one number, as search-and-learn and its_hub do
(``last``, ``min``, ``prod``, ``mean``).

Scorers see the task, never its gold answer: they run at solve time.

Example:
    >>> aggregate([0.9, 0.5, 0.8], "min")
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, Protocol, runtime_checkable

from pydantic import AfterValidator

from refinery.engine.context import Context
from refinery.engine.errors import SpecError
from refinery.engine.types import Task

__all__ = ["AGGREGATIONS", "SCORERS", "STEP_END", "Aggregation", "RegisteredName", "ScorerName",
           "StepScorer", "aggregate", "build_scorer", "split_steps"]

Aggregation = Literal["last", "min", "prod", "mean"]
STEP_END = "\n\n"  # steps are paragraphs, as search-and-learn and its_hub delimit them
MAX_STEPS = 16
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


def split_steps(text: str, max_steps: int | None = MAX_STEPS) -> list[str]:
    r"""A whole solution as steps: its non-empty paragraphs, the ones past ``max_steps``
    joined into the last (a judge scores each step with a call: the cap bounds them;
    ``None``: no cap, for reading back a search's paths whole).

    Example:
        >>> split_steps("3 * 4 = 12\n\n\n12 + 1 = 13\n\nThe answer is 13.", max_steps=2)
        ['3 * 4 = 12', '12 + 1 = 13\n\nThe answer is 13.']
    """
    steps = [s.strip("\n") for s in text.split(STEP_END) if s.strip()]
    if max_steps is not None and len(steps) > max_steps:
        steps[max_steps - 1:] = [STEP_END.join(steps[max_steps - 1:])]
    return steps


def _arith() -> StepScorer:
    from refinery.verifiers.step_arith import ArithStepScorer
    return ArithStepScorer()


def _judge() -> StepScorer:
    from refinery.verifiers.step_judge import JudgeStepScorer
    return JudgeStepScorer()


def _prm() -> StepScorer:
    from refinery.verifiers.step_prm import PRMStepScorer
    return PRMStepScorer.from_env()


# name -> a new scorer. A search builds its own for every solve, so a scorer may
# keep what it already scored of this solve (a judge's earlier steps) and nothing else.
SCORERS: dict[str, Callable[[], StepScorer]] = {"arith": _arith, "judge": _judge,
                                                 "prm": _prm}


@dataclass(frozen=True, eq=False)  # identity hash: typing hashes it (ScorerName | None)
class RegisteredName:
    """A pydantic check that a string is a key of ``names``, read when it checks (a
    name registered later counts); ``allowed`` is what a type description shows."""

    names: Mapping[str, object]
    kind: str

    @property
    def allowed(self) -> list[str]:
        return sorted(self.names)

    def __call__(self, name: str) -> str:
        if name not in self.names:
            raise ValueError(f"unknown {self.kind} {name!r}; known: {', '.join(self.allowed)}")
        return name


ScorerName = Annotated[str, AfterValidator(RegisteredName(SCORERS, "step scorer"))]
"""A strategy parameter naming a step scorer: checked when the spec is parsed."""


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
