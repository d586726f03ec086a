"""DeepConf's confidence signal, as a stop rule the backends run on a stream.

After Fu, Wang, Tian and Zhao, "Deep Think with Confidence" (2025):

- token confidence: minus the mean log-probability of the top-k candidates at
  a position. A peaked distribution (the model is sure) has one candidate near
  0 and the others far below, so the mean is very negative and the confidence
  high; a flat one has all k near ``-log k``, a low confidence;
- group confidence: the token confidences averaged over a sliding window of
  ``window`` tokens;
- a trace's confidence is its lowest group confidence (the paper's "lowest
  group"); also measured: the mean of its bottom 10% groups, the mean over
  its last ``tail`` tokens, and the mean over all tokens.

A trace shorter than the window has one group: all its tokens.

``ConfidenceRule(threshold=None)`` only measures; with a threshold, a sample
is stopped (finish reason ``confidence``, text kept whole) at the first token
that completes a window whose mean falls below it. A full window is needed,
so a stopped trace's lowest group is below the threshold and an unstopped
one's is not, except for a trace that ended before its first full window
(the strategy filters those by the same number).

Example:
    >>> from refinery.engine.types import TopLogprob
    >>> rule = ConfidenceRule(top_k=2, window=2, threshold=1.0)
    >>> mon = rule.start()
    >>> sure = TokenLogprob(token="a", logprob=0.0, top_logprobs=[
    ...     TopLogprob(token="a", logprob=0.0), TopLogprob(token="b", logprob=-4.0)])
    >>> unsure = TokenLogprob(token="a", logprob=-0.7, top_logprobs=[
    ...     TopLogprob(token="a", logprob=-0.7), TopLogprob(token="b", logprob=-0.7)])
    >>> mon.feed("a", [sure, sure]), mon.feed("a", [unsure, unsure])
    (None, Stop(reason='confidence', keep=None))
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.stops import Stop
from refinery.engine.types import TokenLogprob


def token_confidence(token: TokenLogprob, k: int) -> float:
    """Minus the mean log-probability of the ``k`` most likely candidates at a position.

    Without alternatives (an upstream that sent none) the sampled token's own.

    Example:
        >>> token_confidence(TokenLogprob(token="a", logprob=-1.0), 20)
        1.0
    """
    top = token.top_logprobs[:k]
    if not top:
        return -token.logprob
    return -sum(t.logprob for t in top) / len(top)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, linearly interpolated (numpy's default).

    Example:
        >>> percentile([1.0, 2.0, 3.0, 4.0], 90)
        3.7
    """
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class TraceConfidence(BaseModel):
    """One trace's confidence measures (what ``ConfidenceMonitor.measures`` reports).

    ``confidence`` is the lowest group's; ``stopped_at`` the tokens seen when a
    threshold stopped the trace, else None.
    """

    model_config = ConfigDict(frozen=True)

    confidence: float
    bottom10: float
    tail: float
    mean: float
    tokens: int
    stopped_at: int | None = None


class ConfidenceRule(BaseModel):
    """DeepConf's monitor: measures a sample's confidence and, with a threshold, stops it.

    Args:
        top_k: candidates per position the token confidence averages (the paper's 20).
        window: tokens per group (the paper uses 2048 on traces of 10k+ tokens).
        tail: tokens of the tail confidence (the paper's 2048).
        threshold: stop at the first full window whose mean is below this; None
            measures only.

    Example:
        >>> rule = ConfidenceRule(window=32, threshold=9.5)
        >>> gen = await ctx.generate(msgs, stop_rule=rule)  # doctest: +SKIP
        >>> gen[0].finish_reason, gen[0].measures["confidence"]  # doctest: +SKIP
        ('confidence', 9.21)
    """

    model_config = ConfigDict(frozen=True)

    top_k: int = Field(20, ge=1, le=20)
    window: int = Field(2048, ge=1)
    tail: int = Field(2048, ge=1)
    threshold: float | None = None
    # It reads the tokens' logprobs as they come, which a finished text has not.
    stops_whole_as_streamed: ClassVar[bool] = False

    @property
    def top_logprobs(self) -> int:
        return self.top_k

    def start(self) -> ConfidenceMonitor:
        return ConfidenceMonitor(self)


class ConfidenceMonitor:
    """Streaming state for one sample: a running window sum, O(1) per token.

    Attributes:
        confidences: every token's confidence so far.
        groups: every full window's mean so far.
        stopped_at: tokens seen when the threshold stopped the sample.
    """

    __slots__ = ("_rule", "_window", "_sum", "confidences", "groups", "stopped_at")

    def __init__(self, rule: ConfidenceRule) -> None:
        self._rule = rule
        self._window: deque[float] = deque()
        self._sum = 0.0
        self.confidences: list[float] = []
        self.groups: list[float] = []
        self.stopped_at: int | None = None

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None:
        if self.stopped_at is not None:
            return Stop("confidence")
        rule, win = self._rule, self._window
        for token in tokens or ():
            c = token_confidence(token, rule.top_k)
            self.confidences.append(c)
            win.append(c)
            self._sum += c
            if len(win) > rule.window:
                self._sum -= win.popleft()
            if len(win) < rule.window:
                continue
            group = self._sum / rule.window
            self.groups.append(group)
            if rule.threshold is not None and group < rule.threshold:
                self.stopped_at = len(self.confidences)
                return Stop("confidence")
        return None

    def summary(self) -> TraceConfidence | None:
        """The measures so far (None before the first token)."""
        confs = self.confidences
        if not confs:
            return None
        mean = sum(confs) / len(confs)
        groups = sorted(self.groups) or [mean]
        low = groups[:max(1, len(groups) // 10)]
        tail = confs[-self._rule.tail:]
        return TraceConfidence(confidence=groups[0], bottom10=sum(low) / len(low),
                               tail=sum(tail) / len(tail), mean=mean, tokens=len(confs),
                               stopped_at=self.stopped_at)

    def measures(self) -> dict[str, float | int] | None:
        s = self.summary()
        return None if s is None else s.model_dump(exclude_none=True)
