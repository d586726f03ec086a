"""Scoring and aggregates: accuracy with a Wilson interval, unbiased pass@k, lm-eval's GSM8K
filters, per-problem cost, and the :class:`Scorer` that checks one attempt against its gold.

Example:
    >>> acc = accuracy([True, True, False, True])
    >>> round(acc.value, 2), round(acc.low, 3), round(acc.high, 3)
    (0.75, 0.301, 0.954)
    >>> round(pass_at_k(n=10, c=3, k=1), 4)
    0.3
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from refinery.eval.example import Example
from refinery.strategies.profile import wilson_interval
from refinery.verifiers.base import Verdict, Verifier
from refinery.verifiers.code import extract_code
from refinery.verifiers.math import (
    extract_answer,
    extract_gsm8k_flexible,
    extract_gsm8k_strict,
    gsm8k_normalize,
)
from refinery.verifiers.registry import get_verifier

__all__ = [
    "Accuracy",
    "CostSummary",
    "Score",
    "Scorer",
    "accuracy",
    "cost_summary",
    "gsm8k_flexible_match",
    "gsm8k_strict_match",
    "mean_pass_at_k",
    "pass_at_k",
    "wilson_interval",
]

# ------------------------------------------------------------------------------- accuracy


class Accuracy(BaseModel):
    """``correct`` of ``n`` with its 95% Wilson interval ``[low, high]``.

    Example:
        >>> str(accuracy([True, False]))
        '50.0% (9.5-90.5)'
    """

    correct: int
    n: int
    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{100 * self.value:.1f}% ({100 * self.low:.1f}-{100 * self.high:.1f})"


def accuracy(passed: Iterable[bool]) -> Accuracy:
    """Fraction passed, with its Wilson interval (an empty run is 0 of 0, interval [0, 1])."""
    flags = [bool(p) for p in passed]
    k, n = sum(flags), len(flags)
    lo, hi = wilson_interval(k, n)
    return Accuracy(correct=k, n=n, value=k / n if n else 0.0, low=lo, high=hi)


# --------------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al., 2021) for ``n`` samples of which ``c`` are correct.

    ``1 - C(n-c, k) / C(n, k)``, computed as ``1 - prod(1 - k / arange(n-c+1, n+1))``
    (numerically stable); 1.0 when ``n - c < k``.

    Example:
        >>> round(pass_at_k(5, 2, 2), 4)
        0.7
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems given ``(n, c)`` per problem."""
    vals = [pass_at_k(n, c, k) for n, c in counts]
    return float(np.mean(vals)) if vals else 0.0


# ------------------------------------------------------------------------------ GSM8K (lm-eval)


def gsm8k_strict_match(text: str, gold: str, *, cot: bool = False) -> bool:
    """lm-evaluation-harness ``strict-match``: the first ``#### n`` (or, ``cot=True``,
    "The answer is n.") equals the gold after the harness's normalisation.

    Example:
        >>> gsm8k_strict_match("2 + 2 = 4\\n#### 4", "4"), gsm8k_strict_match("4", "4")
        (True, False)
    """
    pred = extract_gsm8k_strict(text or "", cot=cot)
    return pred is not None and gsm8k_normalize(pred) == gsm8k_normalize(gold)


def gsm8k_flexible_match(text: str, gold: str) -> bool:
    """lm-evaluation-harness ``flexible-extract``: the last number-like match equals the gold.

    Example:
        >>> gsm8k_flexible_match("It costs $1,000.", "1000")
        True
    """
    pred = extract_gsm8k_flexible(text or "")
    return pred is not None and gsm8k_normalize(pred) == gsm8k_normalize(gold)


# --------------------------------------------------------------------------------- scoring


class Score(BaseModel):
    """One attempt checked against its example.

    ``prediction`` is what was compared (the extracted answer, or the code that
    ran); ``strict_match`` / ``flexible_match`` are set for GSM8K only.
    """

    passed: bool
    score: float
    prediction: str | None = None
    strict_match: bool | None = None
    flexible_match: bool | None = None
    detail: Any = None


class Scorer:
    """Checks attempts with each example's verifier (one instance per verifier name).

    Math-style checks compare the strategy's extracted ``answer`` (falling back
    to the full text); code checks run the full text with the example's hidden
    tests (``Example.private``) in the sandbox. GSM8K rows also get the harness's
    strict-match and flexible-extract on the full text, as lm-eval scores raw output.

    Example:
        >>> ex = Example(id="q", prompt="2+2?", gold="4", verifier="math")
        >>> asyncio.run(Scorer().score(ex, "so \\\\boxed{4}", "4")).passed
        True
    """

    def __init__(self, verifiers: Mapping[str, Verifier] | None = None,
                 max_concurrency: int = 8) -> None:
        self._verifiers: dict[str, Verifier] = dict(verifiers or {})
        # Bounds sandbox / sympy work in flight; the verifiers have their own pools too.
        self._sem = asyncio.Semaphore(max_concurrency)

    def verifier(self, name: str) -> Verifier:
        if name not in self._verifiers:
            self._verifiers[name] = get_verifier(name)
        return self._verifiers[name]

    async def score(self, example: Example, text: str, answer: str | None = None) -> Score:
        """Score one attempt (``text`` the full solution, ``answer`` the strategy's answer)."""
        text = text or ""
        v = self.verifier(example.verifier)
        if example.verifier == "code":
            candidate, prediction = text, extract_code(text, example.private.get("entry_point"))
        else:
            candidate = answer if answer else text
            prediction = extract_answer(candidate) if candidate else None
        if not candidate.strip():
            verdict = Verdict.of(False, {"reason": "empty answer"})
        else:
            async with self._sem:
                verdict = await v.verify(example.verify_task(), candidate, example.gold)
        strict = flexible = None
        if example.dataset == "gsm8k" and example.gold is not None:
            strict = gsm8k_strict_match(text, example.gold)
            flexible = gsm8k_flexible_match(text, example.gold)
        return Score(passed=verdict.passed, score=verdict.score, prediction=prediction,
                     strict_match=strict, flexible_match=flexible, detail=verdict.detail)


# ----------------------------------------------------------------------------------- cost


class CostSummary(BaseModel):
    """Means per problem over result rows (see :func:`cost_summary`)."""

    n: int = 0
    tokens: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    calls: float = 0.0
    latency_seconds: float = Field(0.0, description="mean seconds from start to answer")
    wall_seconds: float | None = Field(
        None, description="run wall-clock time / problems (throughput view, all sessions)")
    errors: int = 0


def _wall_seconds(rows: Sequence[Mapping[str, Any]]) -> float | None:
    # Each invocation of the run (a row's `session`) counts from its start to its last
    # written result, a killed one up to its last result, so resumed runs add up honestly.
    sessions: dict[str, tuple[float, float]] = {}
    for r in rows:
        sid, start, end = r.get("session"), r.get("session_start"), r.get("time")
        if not isinstance(sid, (str, int)) or not _is_number(start) or not _is_number(end):
            return None
        s0, e0 = sessions.get(sid, (start, end))
        sessions[sid] = (min(s0, start), max(e0, end))
    if not sessions:
        return None
    return sum(e - s for s, e in sessions.values()) / len(rows)


def _mapping(value: Any) -> Mapping[str, Any]:
    """A row's ``usage`` if it is a mapping; anything else (a list, a number) counts as none."""
    return value if isinstance(value, Mapping) else {}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> float:
    """A count or duration of a row: a number (not a bool), else 0 (a missing or garbled
    field adds nothing rather than failing the whole summary)."""
    return float(value) if _is_number(value) else 0.0


def cost_summary(rows: Sequence[Mapping[str, Any]]) -> CostSummary:
    """Tokens, calls and seconds per problem from result rows (``usage``, ``seconds``).

    Example:
        >>> cost_summary([{"usage": {"prompt_tokens": 10, "completion_tokens": 30,
        ...                           "calls": 2}, "seconds": 1.5}]).tokens
        40.0

    A row that is not a mapping is not a result and is not counted.
    """
    rows = [r for r in rows if isinstance(r, Mapping)]
    if not rows:
        return CostSummary()
    n = len(rows)

    def mean(xs: Iterable[float]) -> float:
        return float(sum(xs)) / n

    usage = [_mapping(r.get("usage")) for r in rows]
    pt = mean(_count(u.get("prompt_tokens")) for u in usage)
    ct = mean(_count(u.get("completion_tokens")) for u in usage)
    return CostSummary(
        n=n, tokens=pt + ct, prompt_tokens=pt, completion_tokens=ct,
        calls=mean(_count(u.get("calls")) for u in usage),
        latency_seconds=mean(_count(r.get("seconds")) for r in rows),
        wall_seconds=_wall_seconds(rows),
        errors=sum(1 for r in rows if r.get("error")))
