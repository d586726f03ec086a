"""String checks: exact (normalised) match against a gold answer, and regex match.

Example:
    >>> import asyncio
    >>> from refinery.engine.types import Task
    >>> asyncio.run(ExactVerifier().verify(Task.from_prompt("?"), "$1,000.", "1000")).passed
    True
"""

from __future__ import annotations

import re
from typing import Any

from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Task
from refinery.verifiers.base import Verdict
from refinery.verifiers.math import extract_answer, normalize_answer

try:  # the `regex` module (a transformers dependency) can time out a catastrophic pattern
    import regex as _regex
except ImportError:  # pragma: no cover - exercised only without transformers installed
    _regex = None

__all__ = ["ExactVerifier", "RegexVerifier"]


class ExactVerifier:
    """The answer equals the gold answer after normalisation.

    With ``normalize=True`` both sides go through
    :func:`refinery.verifiers.math.normalize_answer` (commas, ``$``, units, ``\\text{}``,
    one spelling per number...); otherwise only surrounding whitespace is
    ignored. ``extract=True`` first pulls the final answer out of a full
    solution (:func:`refinery.verifiers.math.extract_answer`).

    Example:
        >>> ExactVerifier(case_sensitive=True).case_sensitive
        True
    """

    name = "exact"

    def __init__(self, *, normalize: bool = True, case_sensitive: bool = False,
                 extract: bool = False) -> None:
        self.normalize = normalize
        self.case_sensitive = case_sensitive
        self.extract = extract

    def key(self, s: str) -> str:
        """The comparison form of ``s``."""
        s = normalize_answer(s) if self.normalize else s.strip()
        return s if self.case_sensitive else s.casefold()

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        if gold is None:
            raise InvalidRequestError("the exact verifier needs a gold answer", param="gold")
        pred = (extract_answer(answer) or "") if self.extract else answer
        got, want = self.key(pred), self.key(gold)
        return Verdict.of(bool(want) and got == want, {"answer": got, "gold": want})


class RegexVerifier:
    """The answer matches a regular expression (searched, or ``fullmatch=True``).

    The pattern comes from the constructor, else ``task.metadata["pattern"]``,
    else the gold answer. Matching has a ``timeout`` (seconds) where the
    ``regex`` module is installed, so a catastrophic pattern fails the check
    instead of hanging the caller.

    Example:
        >>> import asyncio
        >>> v = RegexVerifier(r"\\b(?:yes|true)\\b", ignore_case=True)
        >>> asyncio.run(v.verify(Task.from_prompt("?"), "Yes, it is.")).passed
        True
    """

    name = "regex"

    def __init__(self, pattern: str | None = None, *, ignore_case: bool = False,
                 fullmatch: bool = False, timeout: float = 1.0) -> None:
        self.pattern = pattern
        self.ignore_case = ignore_case
        self.fullmatch = fullmatch
        self.timeout = timeout
        if pattern is not None:
            self._compile(pattern)  # fail at construction, not at the first check

    def _compile(self, pattern: str) -> Any:
        flags = re.IGNORECASE if self.ignore_case else 0
        try:
            if _regex is not None:
                return _regex.compile(pattern, (_regex.IGNORECASE if self.ignore_case else 0)
                                      | _regex.V0)
            return re.compile(pattern, flags)
        except (re.error, getattr(_regex, "error", re.error)) as e:
            raise InvalidRequestError(f"bad regex {pattern!r}: {e}", param="pattern") from e

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        pattern = self.pattern or task.metadata.get("pattern") or gold
        if not pattern:
            raise InvalidRequestError(
                "the regex verifier needs a pattern "
                "(constructor, task.metadata['pattern'] or gold)", param="pattern")
        rx = self._compile(pattern)
        match = rx.fullmatch if self.fullmatch else rx.search
        text = answer.strip() if self.fullmatch else answer
        try:
            m = match(text, timeout=self.timeout) if _regex is not None else match(text)
        except TimeoutError:
            return Verdict.of(False, {"pattern": pattern,
                                      "reason": f"match timed out ({self.timeout}s)"})
        detail: dict[str, Any] = {"pattern": pattern, "match": m.group(0) if m else None}
        return Verdict.of(m is not None, detail)
