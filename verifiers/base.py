"""The verifier contract: one ``Verdict`` type, one ``Verifier`` protocol, a registry by name.

A verifier answers "is this answer right?" for one task. Math and exact checks
compare against a gold answer; code and regex checks are label-free (tests or a
pattern ship with the task); the judge asks a model.

Example:
    >>> import asyncio
    >>> from refinery.engine.types import Task
    >>> v = get_verifier("math")
    >>> asyncio.run(v.verify(Task.from_prompt("1/2 + 0?"), r"\\boxed{\\frac{1}{2}}", "0.5")).passed
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from refinery.engine.errors import InvalidRequestError
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


# name -> zero-argument-callable returning the class; imports stay lazy so that
# `refinery.verifiers.base` is cheap and modules never import each other in a cycle.
def _math() -> type:
    from refinery.verifiers.math import MathVerifier
    return MathVerifier


def _gsm8k() -> type:
    from refinery.verifiers.math import GSM8KVerifier
    return GSM8KVerifier


def _code() -> type:
    from refinery.verifiers.code import CodeVerifier
    return CodeVerifier


def _exact() -> type:
    from refinery.verifiers.exact import ExactVerifier
    return ExactVerifier


def _regex() -> type:
    from refinery.verifiers.exact import RegexVerifier
    return RegexVerifier


def _judge() -> type:
    from refinery.verifiers.judge import JudgeVerifier
    return JudgeVerifier


_REGISTRY: dict[str, Callable[[], type]] = {
    "math": _math,
    "gsm8k": _gsm8k,
    "code": _code,
    "exact": _exact,
    "regex": _regex,
    "judge": _judge,
}

VERIFIERS: tuple[str, ...] = tuple(_REGISTRY)
"""Names accepted by :func:`get_verifier` (and by ``Task.verifier``)."""


def get_verifier(name: str, **kwargs: Any) -> Verifier:
    """Build the verifier registered as ``name`` with constructor ``kwargs``.

    Raises:
        InvalidRequestError: ``name`` is not registered (the message lists the known names).

    Example:
        >>> get_verifier("exact").name
        'exact'
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise InvalidRequestError(
            f"unknown verifier {name!r}; known: {', '.join(VERIFIERS)}", param="verifier"
        ) from None
    return factory()(**kwargs)
