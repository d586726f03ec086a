"""Early exit from thinking (DEER): when a trial answer is confident, the thinking ends.

A reasoning model often keeps thinking long after it knows the answer. DEER tries
an answer at each reasoning boundary (a "Wait", an "Alternatively", a blank line):
the partial thinking is closed and a short trial answer generated; when the
trial's tokens are probable enough on average, the model was already sure, and
the sample ends its thinking there and answers.

:class:`EarlyExitRule` is the decision, configuration only; ``rule.start()``
returns a fresh :class:`EarlyExitMonitor` for one sample, which ``observe``\\ s
each trial answer and says whether to exit: when the trial's mean token
probability reaches ``threshold`` (DEER's test), or when the same trial answer
came ``repeats`` times in a row (a stable answer is a settled one).

Why not a ``StopRule`` (engine/stops.py): a trial answer is a generation of its
own, on a side branch of the sample, while a stop rule's monitor is fed the
sample's text synchronously inside the stream loop, where no generation can
run. So the strategy (``strategies/early_exit.py``) generates up to each
boundary, asks the backend for the trial, and feeds it here.

Sources: Yang et al. 2025, "Dynamic Early Exit in Reasoning Models" (DEER).

Example:
    >>> from refinery.engine.types import TokenLogprob
    >>> monitor = EarlyExitRule(threshold=0.9, repeats=2).start()
    >>> monitor.observe("12", [TokenLogprob(token="12", logprob=-0.5)]).exit
    >>> monitor.observe("14", [TokenLogprob(token="14", logprob=-0.01)]).exit
    'confident'
    >>> monitor.measures()["trials"]
    2
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from refinery.engine.types import TokenLogprob

__all__ = ["ANSWER_LEAD", "BOUNDARIES", "EarlyExitMonitor", "EarlyExitRule", "Trial"]

# Where a model's thinking changes course: DEER's transition points.
BOUNDARIES: tuple[str, ...] = ("Wait", "Alternatively", "\n\n")
# What a trial answer is written after: its tokens are the answer itself.
ANSWER_LEAD = "\n\nThe answer is \\boxed{"

ExitReason = Literal["confident", "repeated"]


@dataclass(frozen=True)
class Trial:
    """One trial answer and what the rule made of it (``exit`` None: think on)."""

    text: str
    confidence: float  # mean token probability of the trial answer (0 when empty)
    exit: ExitReason | None


def mean_probability(tokens: Sequence[TokenLogprob] | None) -> float:
    """The mean of the tokens' probabilities (DEER's confidence); 0 for no tokens.

    >>> mean_probability([TokenLogprob(token="a", logprob=0.0),
    ...                   TokenLogprob(token="b", logprob=math.log(0.5))])
    0.75
    """
    if not tokens:
        return 0.0
    return sum(math.exp(t.logprob) for t in tokens) / len(tokens)


@dataclass(frozen=True)
class EarlyExitRule:
    """Configuration of the exit test, and a factory of per-sample monitors.

    ``repeats=0`` turns the repeated-answer test off.
    """

    threshold: float = 0.9
    repeats: int = 2
    boundaries: tuple[str, ...] = BOUNDARIES

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.repeats < 0:
            raise ValueError(f"repeats must be >= 0, got {self.repeats}")
        if not self.boundaries or not all(self.boundaries):
            raise ValueError("boundaries must be non-empty strings")

    def start(self) -> EarlyExitMonitor:
        return EarlyExitMonitor(self)


@dataclass
class EarlyExitMonitor:
    """The rule's state on one sample: the trials seen so far."""

    rule: EarlyExitRule
    trials: list[Trial] = field(default_factory=list)

    def observe(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Trial:
        """Judge one trial answer (its text and its tokens' logprobs)."""
        answer = text.strip()
        confidence = mean_probability(tokens) if answer else 0.0
        trial = Trial(answer, confidence, self._decide(answer, confidence))
        self.trials.append(trial)
        return trial

    def _decide(self, answer: str, confidence: float) -> ExitReason | None:
        if not answer:
            return None  # an empty trial is no answer at all
        if confidence >= self.rule.threshold:
            return "confident"
        run = 1
        for before in reversed(self.trials):
            if before.text != answer:
                break
            run += 1
        return "repeated" if self.rule.repeats and run >= self.rule.repeats else None

    def measures(self) -> dict[str, float | int]:
        """What the rule measured, for the trace: trials, the last confidence, the best."""
        confidences = [t.confidence for t in self.trials]
        return {"trials": len(self.trials),
                "last_confidence": confidences[-1] if confidences else 0.0,
                "max_confidence": max(confidences, default=0.0)}
