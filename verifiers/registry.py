"""Verifiers by name: ``get_verifier("math")``, and the names ``Task.verifier`` accepts.

Example:
    >>> import asyncio
    >>> from refinery.engine.types import Task
    >>> v = get_verifier("math")
    >>> asyncio.run(v.verify(Task.from_prompt("1/2 + 0?"), r"\\boxed{\\frac{1}{2}}", "0.5")).passed
    True
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from refinery.engine.errors import InvalidRequestError
from refinery.verifiers.base import Verifier
from refinery.verifiers.code import CodeVerifier
from refinery.verifiers.exact import ExactVerifier, RegexVerifier
from refinery.verifiers.judge import JudgeVerifier
from refinery.verifiers.math import GSM8KVerifier, MathVerifier

# Read-only: name -> verifier class.
REGISTRY: MappingProxyType[str, type] = MappingProxyType({
    "math": MathVerifier,
    "gsm8k": GSM8KVerifier,
    "code": CodeVerifier,
    "exact": ExactVerifier,
    "regex": RegexVerifier,
    "judge": JudgeVerifier,
})

VERIFIERS: tuple[str, ...] = tuple(REGISTRY)
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
        cls = REGISTRY[name]
    except KeyError:
        raise InvalidRequestError(
            f"unknown verifier {name!r}; known: {', '.join(VERIFIERS)}", param="verifier"
        ) from None
    return cls(**kwargs)
