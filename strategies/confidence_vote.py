"""The confidence-weighted vote of DeepConf: who votes, with what weight, and who wins.

A trace votes when it has an answer, was not stopped and its lowest group
confidence reaches the threshold; its confidence is its weight. Kept apart from
the strategy (``strategies/deepconf.py``) so the vote can be read, and tested, alone.

Example:
    >>> def trace(answer, confidence):
    ...     return Attempt(text=answer, answer=answer,
    ...                    metadata={"measures": {"confidence": confidence}})
    >>> attempts = [trace("12", 5.0), trace("12", 4.8), trace("7", 9.0), trace("7", 3.0)]
    >>> pool = [voter(a, threshold=4.5) for a in attempts]
    >>> [v.weight for v in pool]
    [5.0, 4.8, 9.0, 0.0]
    >>> election = elect(pool)
    >>> election.votes, election.chosen.attempt.answer
    ({'12': 9.8, '7': 9.0}, '12')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from refinery.engine.types import Attempt
from refinery.verifiers.math import normalize_answer

__all__ = ["Election", "Ended", "Voter", "elect", "share", "tally", "voter"]


@dataclass(frozen=True)
class Voter:
    """One trace as the vote sees it: answer key ("" for none), lowest group confidence
    (None: no logprobs), where the threshold stopped it, and its weight (0: no vote)."""

    attempt: Attempt
    key: str
    confidence: float | None
    stopped_at: int | None
    weight: float

    def record(self) -> dict[str, Any]:
        return {"answer": self.key or None, "confidence": self.confidence,
                "stopped_at": self.stopped_at, "weight": self.weight}


def voter(attempt: Attempt, threshold: float | None) -> Voter:
    """A trace votes, its confidence as weight (1 if unknown), when it has an answer,
    was not stopped and its confidence reaches the threshold."""
    m = attempt.metadata.get("measures") or {}
    conf, stop = m.get("confidence"), m.get("stopped_at")
    key = normalize_answer(attempt.answer) if attempt.answer else ""
    kept = bool(key) and stop is None and (threshold is None or conf is None or conf >= threshold)
    return Voter(attempt, key, conf, stop, (1.0 if conf is None else conf) if kept else 0.0)


def tally(voters: Sequence[Voter]) -> dict[str, float]:
    votes: dict[str, float] = {}
    for v in voters:
        if v.weight > 0:
            votes[v.key] = votes.get(v.key, 0.0) + v.weight
    return votes


def share(votes: dict[str, float]) -> float:
    """The leading answer's share of the weighted vote (0 with no vote)."""
    total = sum(votes.values())
    return max(votes.values()) / total if total > 0 else 0.0


@dataclass(frozen=True)
class Ended:
    """Why sampling ended: ``offline``, ``consensus``, ``n`` traces, or ``budget``."""

    reason: str
    budget: str | None = None  # the budget's message


@dataclass(frozen=True)
class Election:
    """The vote's outcome: the answer's most confident voter, the votes, the voters."""

    chosen: Voter
    votes: dict[str, float]
    voters: int


def elect(pool: Sequence[Voter]) -> Election:
    """Weighted vote; with no voter, every trace with an answer votes (stopped ones too)."""
    voters = [v for v in pool if v.weight > 0] or [
        replace(v, weight=v.confidence or 1.0) for v in pool if v.key]
    votes = tally(voters)
    best = max(votes, key=votes.__getitem__) if votes else None
    group = [v for v in voters if v.key == best] or list(pool)
    chosen = max(group, key=lambda v: -math.inf if v.confidence is None else v.confidence)
    return Election(chosen, votes, len(voters))
