"""Stop rules: monitors that watch a sample while it streams and may end it early.

Contract used by the backends: a ``StopRule`` is configuration; ``rule.start()``
returns a fresh ``StopMonitor`` for one sample; ``monitor.feed(text, tokens)``
gets each streamed piece of the sample's text with its tokens' logprobs and
returns a ``Stop`` once the sample should end, else None;
``monitor.measures()`` is what it measured, kept on the ``Completion``.

A rule with ``top_logprobs = k > 0`` needs each token's top-k alternatives: the
backend then asks the engine for ``logprobs`` with ``top_logprobs >= k`` (and
hands the caller only what the caller asked for). With ``k = 0`` the monitor
gets ``tokens=None`` unless the caller asked for logprobs anyway.

Implementations:

- ``LoopRule`` wraps a loop detector (``engine/loops.py``, the CUSUM one):
  finish reason ``loop``, text cut at the loop's onset. Backends and ``Context``
  also take a bare loop detector; ``as_rule`` wraps it.
- ``ConfidenceRule`` (``engine/confidence.py``): DeepConf's group confidence
  below a threshold; finish reason ``confidence``, text kept whole.
- ``AnyRule``: several rules on one sample, the first to stop it wins.
- ``AbortSwitch``: stops every sample it watches once its owner decided
  (``asc``); finish reason ``abort``.

``WatchedSample`` is the one driver both backends use, so a rule behaves the
same in-process (AsyncLLM: closing the stream aborts the request) and on an
OpenAI-compatible upstream (closing the HTTP stream aborts it).

Example:
    >>> watch = WatchedSample(as_rule(CusumLoopDetector()))
    >>> kept = watch.add(piece, tokens)
    >>> watch.stop  # None while the sample goes on, else Stop(reason="loop", keep=...)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from refinery.engine.loops import CusumLoopDetector, LoopDetector, Monitor, cut_at
from refinery.engine.types import Delta, FinishReason, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class Stop:
    """A monitor's decision to end a sample: the finish reason, and how many chars of
    the sample's text to keep (None: all of it, up to the piece that tipped it)."""

    reason: FinishReason
    keep: int | None = None


class StopMonitor(Protocol):
    """The streaming state of one rule on one sample."""

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None: ...

    def measures(self) -> dict[str, float | int] | None: ...


@runtime_checkable
class StopRule(Protocol):
    """Configuration and a factory of per-sample monitors."""

    top_logprobs: int  # top-k alternatives per token the monitors need (0: none)

    def start(self) -> StopMonitor: ...


class _LoopMonitor:
    __slots__ = ("monitor",)

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None) -> Stop | None:
        alarm = self.monitor.feed(text) if text else None
        return None if alarm is None else Stop("loop", keep=alarm.onset)

    def measures(self) -> None:
        return None


@dataclass(frozen=True)
class LoopRule:
    """A loop detector as a stop rule: reason ``loop``, cut at the loop's onset.

    Example:
        >>> mon = LoopRule(CusumLoopDetector()).start()
        >>> mon.feed("Two plus two is four.", None) is None
        True
    """

    detector: LoopDetector
    top_logprobs: ClassVar[int] = 0

    def start(self) -> StopMonitor:
        return _LoopMonitor(self.detector.new())


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

    Example:
        >>> AnyRule((LoopRule(CusumLoopDetector()), ConfidenceRule(threshold=9.0))).top_logprobs
        20
    """

    rules: tuple[StopRule, ...]

    @property
    def top_logprobs(self) -> int:
        return max((r.top_logprobs for r in self.rules), default=0)

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
    they end through the backend's own stream, their tokens are counted.

    Example:
        >>> switch = AbortSwitch()
        >>> mon = switch.start()
        >>> mon.feed("Two", None) is None, switch.fire(), mon.feed(" plus", None)
        (True, None, Stop(reason='abort', keep=None))
    """

    top_logprobs: ClassVar[int] = 0

    def __init__(self) -> None:
        self.fired = False

    def fire(self) -> None:
        self.fired = True

    def start(self) -> StopMonitor:
        return _SwitchMonitor(self)


Watcher = StopRule | LoopDetector


def as_rule(monitor: Watcher | None) -> StopRule | None:
    """``monitor`` as a stop rule: a rule as it is, a loop detector wrapped in ``LoopRule``."""
    if monitor is None or isinstance(monitor, StopRule):
        return monitor
    return LoopRule(monitor)


def combine(*monitors: Watcher | None) -> Watcher | None:
    """The monitors of one call as one: None if none, the one itself if one, else ``AnyRule``.

    A single loop detector stays as given (so a backend, or a test, sees the detector).
    """
    found = [m for m in monitors if m is not None]
    if len(found) <= 1:
        return found[0] if found else None
    return AnyRule(tuple(r for m in found if (r := as_rule(m)) is not None))


def checks_whole(rule: StopRule | None) -> bool:
    """Whether ``rule``, fed a finished sample's whole text at once, stops it where it
    would have stopped it streamed (same finish reason, same cut).

    A backend may then check such a sample after it ends instead of streaming it:
    the answer is the same, only the tokens past the stop are spent. True for the
    CUSUM loop detector (its alarm does not depend on how the text is chunked) and
    for rules made only of it; False for rules that read token logprobs as they
    come (``ConfidenceRule``) and for loop detectors not known to be chunk-free.

    Example:
        >>> checks_whole(LoopRule(CusumLoopDetector())), checks_whole(ConfidenceRule())
        (True, False)
    """
    if isinstance(rule, AnyRule):
        return all(checks_whole(r) for r in rule.rules)
    return isinstance(rule, LoopRule) and isinstance(rule.detector, CusumLoopDetector)


def check_whole(rule: StopRule, params: SamplingParams, n: int, limit: int | None) -> bool:
    """Whether a backend may run a call of ``n`` samples under ``rule`` as one
    n-sample request and check each sample once it ends, instead of streaming
    each sample as its own request.

    Only for rules that stop a whole text where they stop a stream
    (:func:`checks_whole`), and only up to ``limit`` tokens (None: never): a
    looping sample then runs to ``max_tokens``, so long calls lose more tokens
    than one request saves. Never for n > 1 greedy samples, which vLLM refuses
    in one request.

    Example:
        >>> check_whole(LoopRule(CusumLoopDetector()), SamplingParams(max_tokens=128), 5, 128)
        True
    """
    return (limit is not None and params.max_tokens <= limit and checks_whole(rule)
            and (n == 1 or params.temperature > 0))


def wire_params(params: SamplingParams, rule: StopRule | None) -> SamplingParams:
    """What to ask the engine for: ``params``, with the top-k logprobs ``rule`` needs.

    Example:
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


class WatchedSample:
    """One streamed sample under a fresh monitor of ``rule`` (if any): the shared driver.

    Both backends feed it each piece as it arrives, with the piece's tokens when
    they were fetched: ``add`` returns the part of the piece to pass on; once a
    monitor stops the sample, ``stop`` is set and ``text`` ends where it says
    (``onset``: the cut, when the stop keeps less than all).

    Example:
        >>> watch = WatchedSample(as_rule(CusumLoopDetector()))
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
        >>> stream = WatchedStream(as_rule(CusumLoopDetector()), SamplingParams())
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
