"""Stop rules: what watches a sample while it is generated and may end it early.

The one stop protocol, used by every layer (backends, ``Context``, strategies,
the server): a ``StopRule`` is configuration; ``rule.start()`` returns a fresh
``StopMonitor`` for one sample; ``monitor.feed(text, tokens)`` gets each piece
of the sample's text with its tokens' logprobs and returns a ``Stop`` once the
sample should end, else None; ``monitor.measures()`` is what it measured, kept
on the ``Completion``.

A rule with ``top_logprobs = k > 0`` needs each token's top-k alternatives: the
backend then asks the engine for ``logprobs`` with ``top_logprobs >= k`` (and
hands the caller only what the caller asked for). With ``k = 0`` the monitor
gets ``tokens=None`` unless the caller asked for logprobs anyway. A rule with
``stops_whole_as_streamed`` stops a finished sample's whole text, fed at once,
where it stops the same text streamed (``fan_out.may_check_after_end`` says
what a backend makes of that).

Implementations:

- ``CusumLoopDetector`` (``engine/loops.py``): finish reason ``loop``, text cut
  at the loop's onset; it stops a whole text as it stops a stream.
- ``ConfidenceRule`` (``engine/confidence.py``): DeepConf's group confidence
  below a threshold; finish reason ``confidence``, text kept whole.
- ``AnyRule``: several rules on one sample, the first to stop it wins.
- ``AbortSwitch``: stops every sample it watches once its owner decided
  (``asc``); finish reason ``abort``.

``WatchedStream`` is the one loop every backend streams a sample through, so a
rule behaves the same in-process (AsyncLLM: closing the stream aborts the
request) and on an OpenAI-compatible upstream (closing the HTTP stream aborts it).

Example:
    >>> from refinery.engine.loops import CusumLoopDetector
    >>> watch = WatchedSample(CusumLoopDetector())
    >>> watch.add("Two plus two is four.")
    'Two plus two is four.'
    >>> watch.stop is None  # else Stop(reason="loop", keep=...) once it loops
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from refinery.engine.types import Delta, FinishReason, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class Stop:
    """A monitor's decision to end a sample: the finish reason, and how many chars of
    the sample's text to keep (None: all of it, up to the piece that tipped it)."""

    reason: FinishReason
    keep: int | None = None


class StopMonitor(Protocol):
    """The state of one rule on one sample."""

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None: ...

    def measures(self) -> dict[str, float | int] | None: ...


class StopRule(Protocol):
    """Configuration and a factory of per-sample monitors."""

    top_logprobs: int  # top-k alternatives per token the monitors need (0: none)
    # Whether the whole text of a finished sample, fed at once, is stopped where the
    # same text streamed piece by piece is (same finish reason, same cut).
    stops_whole_as_streamed: bool

    def start(self) -> StopMonitor: ...


class _AnyMonitor:
    __slots__ = ("monitors",)

    def __init__(self, monitors: list[StopMonitor]) -> None:
        self.monitors = monitors

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None:
        stops = [m.feed(text, tokens) for m in self.monitors]  # every monitor sees every piece
        return next((s for s in stops if s is not None), None)

    def measures(self) -> dict[str, float | int] | None:
        found = [m for mon in self.monitors if (m := mon.measures())]
        return {k: v for m in found for k, v in m.items()} if found else None


@dataclass(frozen=True)
class AnyRule:
    """Several rules on one sample; the first (in order) to stop it wins.

    ``AnyRule.of`` is how callers join the rules of one call (some may be None).

    Example:
        >>> from refinery.engine.confidence import ConfidenceRule
        >>> from refinery.engine.loops import CusumLoopDetector
        >>> both = AnyRule.of(CusumLoopDetector(), None, ConfidenceRule())
        >>> both.top_logprobs, both.stops_whole_as_streamed
        (20, False)
    """

    rules: tuple[StopRule, ...]

    @classmethod
    def of(cls, *rules: StopRule | None) -> StopRule | None:
        """The rules given, as one: None if none, the rule itself if one, else an AnyRule."""
        found = tuple(r for r in rules if r is not None)
        if len(found) <= 1:
            return found[0] if found else None
        return cls(found)

    @property
    def top_logprobs(self) -> int:
        return max((r.top_logprobs for r in self.rules), default=0)

    @property
    def stops_whole_as_streamed(self) -> bool:
        return all(r.stops_whole_as_streamed for r in self.rules)

    def start(self) -> StopMonitor:
        return _AnyMonitor([r.start() for r in self.rules])


class _SwitchMonitor:
    __slots__ = ("switch",)

    def __init__(self, switch: AbortSwitch) -> None:
        self.switch = switch

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None:
        return Stop("abort") if self.switch.fired else None

    def measures(self) -> None:
        return None


class AbortSwitch:
    """A rule that ends every sample it watches at the next piece once ``fire()``d.

    For a strategy that runs samples concurrently and decides before all of them
    end (``asc``): the samples still running stop with finish ``abort``, and as
    they end through the backend's own stream, their tokens are counted. What it
    stops depends on when it fires, so a sample under it is always streamed.

    Example:
        >>> switch = AbortSwitch()
        >>> mon = switch.start()
        >>> mon.feed("Two", None) is None, switch.fire(), mon.feed(" plus", None)
        (True, None, Stop(reason='abort', keep=None))
    """

    top_logprobs: ClassVar[int] = 0
    stops_whole_as_streamed: ClassVar[bool] = False

    def __init__(self) -> None:
        self.fired = False

    def fire(self) -> None:
        self.fired = True

    def start(self) -> StopMonitor:
        return _SwitchMonitor(self)


def wire_params(params: SamplingParams, rule: StopRule | None) -> SamplingParams:
    """What to ask the engine for: ``params``, with the top-k logprobs ``rule`` needs.

    Example:
        >>> from refinery.engine.confidence import ConfidenceRule
        >>> wire_params(SamplingParams(), ConfidenceRule(top_k=5)).top_logprobs
        5
    """
    need = rule.top_logprobs if rule is not None else 0
    if not need or (params.logprobs and params.top_logprobs >= need):
        return params
    return params.but(logprobs=True, top_logprobs=need)


def caller_tokens(tokens: list[TokenLogprob] | None,
                  params: SamplingParams) -> list[TokenLogprob] | None:
    """The part of ``tokens`` (fetched for the wire params) the caller asked for."""
    if not params.logprobs or tokens is None:
        return None
    k = params.top_logprobs
    return [t if len(t.top_logprobs) <= k
            else t.model_copy(update={"top_logprobs": t.top_logprobs[:k]}) for t in tokens]


def cut_at(text: str, piece: str, keep: int) -> tuple[int, str]:
    """Where a stream is cut to keep ``keep`` chars, on the arrival of ``piece``.

    ``text`` is what came before ``piece``. Returns the cut clamped to the text
    seen so far, and the part of ``piece`` before it (still to be sent).

    Example:
        >>> cut_at("abc", "defg", 5), cut_at("abc", "defg", 2), cut_at("abc", "de", 99)
        ((5, 'de'), (2, ''), (5, 'de'))
    """
    onset = max(0, min(keep, len(text) + len(piece)))
    return onset, piece[:max(0, onset - len(text))]


class WatchedSample:
    """One streamed sample under a fresh monitor of ``rule`` (if any): the shared driver.

    Both backends feed it each piece as it arrives, with the piece's tokens when
    they were fetched: ``add`` returns the part of the piece to pass on; once a
    monitor stops the sample, ``stop`` is set and ``text`` ends where it says
    (``onset``: the cut, when the stop keeps less than all).

    Example:
        >>> from refinery.engine.loops import CusumLoopDetector
        >>> watch = WatchedSample(CusumLoopDetector())
        >>> kept = watch.add("Two plus two is four.")
        >>> watch.text, watch.stop
        ('Two plus two is four.', None)
    """

    def __init__(self, rule: StopRule | None) -> None:
        self.monitor = rule.start() if rule is not None else None
        self.text = ""
        self.stop: Stop | None = None
        self.onset: int | None = None

    def add(self, piece: str, tokens: Sequence[TokenLogprob] | None = None) -> str:
        stop = (self.monitor.feed(piece, tokens)
                if self.monitor is not None and self.stop is None and (piece or tokens)
                else None)
        if stop is None:
            self.text += piece
            return piece
        self.stop = stop
        if stop.keep is None:
            self.text += piece
            return piece
        # Clamped to the text seen so far; the part of the piece before the cut goes on.
        self.onset, kept = cut_at(self.text, piece, stop.keep)
        self.text = (self.text + piece)[:self.onset]
        return kept

    def measures(self) -> dict[str, Any] | None:
        return self.monitor.measures() if self.monitor is not None else None


@dataclass
class Piece:
    """One piece of a streamed sample as a backend receives it from its engine."""

    text: str
    tokens: list[TokenLogprob] | None = None  # the piece's tokens, when fetched
    n_tokens: int = 0
    finish_reason: str | None = None


class WatchedStream:
    """The one loop every backend streams a sample through: pieces in, deltas out.

    ``deltas`` passes each piece through a ``WatchedSample`` of ``rule``, yields
    what the caller may see (text, and the logprobs it asked for), and ends as
    soon as a monitor stops the sample; closing the piece iterator then is how
    the engine learns to abort the request. Afterwards ``finish``, ``n_tokens``,
    ``tokens`` and ``watch`` describe the sample, for the backend's Completion.

    Example:
        >>> from refinery.engine.loops import CusumLoopDetector
        >>> stream = WatchedStream(CusumLoopDetector(), SamplingParams())
        >>> async for delta in stream.deltas(pieces):  # doctest: +SKIP
        ...     print(delta.text, end="")
    """

    def __init__(self, rule: StopRule | None, params: SamplingParams) -> None:
        self.watch = WatchedSample(rule)
        self.params = params
        self.finish: str | None = None
        self.n_tokens = 0
        self.tokens: list[TokenLogprob] = []

    async def deltas(self, pieces: AsyncIterator[Piece]) -> AsyncIterator[Delta]:
        async with contextlib.aclosing(pieces):
            async for piece in pieces:
                self.n_tokens += piece.n_tokens
                shown = caller_tokens(piece.tokens, self.params)
                self.tokens += shown or []
                kept = self.watch.add(piece.text, piece.tokens)
                if kept or shown:
                    yield Delta(text=kept, logprobs=shown)
                if self.watch.stop is not None:
                    self.finish = self.watch.stop.reason
                    return
                if piece.finish_reason is not None:
                    self.finish = piece.finish_reason
