"""The verifier contract: one ``Verdict`` type and one ``Verifier`` protocol.

A verifier answers "is this answer right?" for one task. Math and exact checks
compare against a gold answer; code and regex checks are label-free (tests or a
pattern ship with the task); the judge asks a model. The concrete verifiers
import this module; :mod:`refinery.verifiers.registry` imports them and
builds one by name.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.types import Task


class Verdict(BaseModel):
    """The outcome of one check.

    ``passed`` is the decision, ``score`` a grade in [0, 1] (1.0/0.0 for binary
    checks, a scaled rubric score for the judge), ``detail`` a human-readable
    reason or a dict of facts behind the decision (extracted answer, exit code...).

    Example:
        >>> Verdict(passed=True, score=1.0, detail="ok").passed
        True
    """

    model_config = ConfigDict(frozen=True)

    passed: bool
    score: float = Field(ge=0.0, le=1.0)
    detail: str | dict[str, Any] = ""

    @classmethod
    def of(cls, passed: bool, detail: str | dict[str, Any] = "") -> Verdict:
        """A binary verdict: score 1.0 when passed, else 0.0."""
        return cls(passed=passed, score=1.0 if passed else 0.0, detail=detail)


@runtime_checkable
class Verifier(Protocol):
    """What every verifier provides.

    ``answer`` is the model's full solution text or an already extracted answer
    (verifiers extract what they need); ``gold`` is the reference answer where
    the check needs one (math, exact) and ``None`` for label-free checks.
    """

    name: str

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        """Check ``answer`` for ``task``; never raises for a wrong answer."""
        ...
