"""Loop detection: a stop rule that flags circular reasoning as a sample streams.

``CusumLoopDetector`` is a ``StopRule`` (``engine/stops.py``): ``start()`` returns
a fresh ``CusumMonitor`` for one sample, whose ``feed(text_delta)`` returns
``Stop("loop", keep=onset)`` once the sample is judged to loop, else None; the
caller then stops the generation and keeps ``text[:onset]``. The monitor's
``alarm`` says where the loop began and where it was caught (for the benches).

The detector, ``CusumLoopDetector`` (our design, a standard one-sided CUSUM after
the Circular Reasoning / LoopBench paper, whose code is not public):

1. The stream is cut into *units*: words, groups of up to 3 digits, and single
   punctuation marks; a new *step* starts after a newline or after ``.!?:`` and a
   space. A unit is processed once the two chars after it are known, so units,
   steps and hence the alarm do not depend on how the text was chunked:
   char-by-char, token-by-token and whole-text feeding give the same alarm.
2. Signal: unit t is *repeated* (x_t = 1, else 0) if the ``ngram`` units ending at t
   already occurred within the previous ``window`` units, either verbatim, or with
   numbers masked when at least half of the n-gram's units are words. Verbatim
   catches statement loops and numerical loops that repeat the same numbers; the
   masked form catches loops that count while they repeat ("Step 5: compute the
   cost again. Step 6: compute the cost again."). The word quota keeps
   enumerations of different numbers ("Day 1: 5 apples, Day 2: 10 apples", "7, 14,
   21") from matching.
3. One-sided CUSUM over units: ``S_t = max(0, S_{t-1} + x_t - mu - k)``; alarm when
   ``S_t > h``, but not before ``warmup`` units. ``S`` is then roughly "units of
   repeated text, net of the slack", so ``h`` reads as a length of repetition.
4. Onset: the excursion of ``S`` above zero that led to the alarm started at a
   repeated unit, whose n-gram is the start of the copy. ``alarm.onset`` is the
   first step start inside that n-gram (all of it is repeated), so the cut keeps
   the first copy, ends on a whole sentence, and drops the loop; a loop inside one
   line is cut at the n-gram's first unit.

Why per unit and not per sentence: a per-step signal (max word-trigram Jaccard of a
sentence against the previous W sentences, plus a repeated-number ratio) was tried
first. On this model's output it could not tell loops from its formulaic but
finished answers (precision 0.3-0.7 at any threshold, on a first 400-generation
set), it needed a forced cut for loops without punctuation ("$20 * 10% = $20 *
10% = ..."), and it weighed a 4-word step like a 40-word one. Counting repeated
units fixes all three; numbers are handled by the verbatim and masked n-grams.

Cost: ``feed`` scans only the new chars (plus at most one pending unit); each
completed unit costs two tuple hashes and a few dict operations, O(ngram) and
independent of ``window``: about 4 us per model token on one CPU core.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.stops import Stop
from refinery.engine.types import TokenLogprob


@dataclass(frozen=True)
class LoopAlarm:
    """``onset``: char offset in the sample's text where the loop began;
    ``position``: chars seen when the alarm fired. Precisely: the end of the unit that
    tipped it, which the monitor decides once two more chars are in, so a token
    stream has seen at most that token beyond it; a whole text fed at once reports
    the same position as the same text fed token by token."""

    onset: int
    position: int


# A unit is a group of at most 3 digits, a run of at most 24 letters, or any other
# non-space char. Digit groups make a number weigh about what it costs in tokens
# ("$42,000" is 4 units; SmolLM2 spends 7 tokens on it, a 3-digit tokenizer 4), so
# a loop of figures is seen as fast as a loop of words; the bounds also make a
# degenerate "0.000000000000..." a run of repeating units, not one endless unit.
_UNIT = re.compile(r"\d{1,3}|[^\W\d_]{1,24}|[^\w\s]|_")
_LONG_GAP = 64  # whitespace kept verbatim between units; longer runs are squeezed
_NUM = "#"
_CLOSERS = frozenset(".,;:!?)]}\"'")
_TERMINATORS = frozenset(".!?:")  # followed by whitespace, they end a step


class CusumLoopDetector(BaseModel):
    """CUSUM loop detector: configuration plus a factory of per-sample monitors.

    Defaults were calibrated on ``data/loops/calibration.jsonl`` (real SmolLM2-135M
    generations on GSM8K) by ``python bench/loops.py --calibrate``; how, in
    docs/benchmarks.md. Another model needs its own ``mu`` and, likely, ``h``.

    Args:
        ngram: n, units per n-gram; an n-gram seen before marks its last unit repeated.
        window: W, how many previous units an n-gram is looked up in.
        mu: expected share of repeated units in clean text.
        k: CUSUM slack above ``mu``.
        h: CUSUM decision threshold, in units of (net) repeated text.
        warmup: no alarm before this many units.
        word_share: share of an n-gram's units that must be words for its
            numbers-masked form to count as a repeat (keeps lists of numbers out).

    Example:
        >>> det = CusumLoopDetector()
        >>> mon = det.start()
        >>> text = "First add 3 and 4 to get 7. " + "Then we add 3 and 4 again to check. " * 12
        >>> stop = mon.feed(text)
        >>> stop.reason, text[: stop.keep].count("Then we")  # the cut keeps the first copy only
        ('loop', 1)
    """

    model_config = ConfigDict(frozen=True)

    # Calibrated by ``python bench/loops.py --calibrate``: how each default was
    # chosen, and the figures, are in docs/benchmarks.md (``bench/loops.py``).
    ngram: int = Field(28, ge=2)
    window: int = Field(1024, ge=8)
    mu: float = Field(0.01, ge=0.0, le=1.0)
    k: float = Field(0.39, ge=0.0)
    h: float = Field(17.0, gt=0.0)
    warmup: int = Field(0, ge=0)
    word_share: float = Field(0.5, ge=0.0, le=1.0)

    top_logprobs: ClassVar[int] = 0  # reads the text only
    # Units, steps and hence the alarm do not depend on how the text is chunked.
    stops_whole_as_streamed: ClassVar[bool] = True

    def start(self) -> CusumMonitor:
        """A fresh monitor for one sample."""
        return CusumMonitor(self)


class CusumMonitor:
    """Streaming state for one sample; see ``CusumLoopDetector``.

    After an alarm every further ``feed`` returns the same stop.

    Example:
        >>> mon = CusumLoopDetector().start()
        >>> [mon.feed(piece) for piece in ["Two ", "plus ", "two ", "is four."]]
        [None, None, None, None]

    Attributes:
        alarm: the alarm, once raised.
        peak: the largest ``S`` reached so far (for calibration).
        n_units: units processed (the first ``ngram - 1`` cannot repeat).
        n_repeated: units found repeated.
    """

    __slots__ = ("_n", "_drift", "_h", "_warmup", "_window", "_buf", "_base", "_prev",
                 "_units", "_starts", "_wordy", "_seen_v", "_seen_m", "_expire", "_s",
                 "_run", "_min_words", "alarm", "peak", "n_units", "n_repeated")

    def __init__(self, cfg: CusumLoopDetector) -> None:
        self._n = cfg.ngram
        self._drift = cfg.mu + cfg.k
        self._h = cfg.h
        self._warmup = cfg.warmup
        self._window = cfg.window
        self._min_words = cfg.word_share * cfg.ngram
        self._buf = ""  # unprocessed tail of the text
        self._base = 0  # char offset of _buf[0] in the sample's text
        self._prev = ""  # the last unit processed
        # The last n units (verbatim text, masked text, is-word) and their
        # (start offset, starts-a-step) pairs.
        self._units: deque[tuple[str, str, bool]] = deque(maxlen=cfg.ngram)
        self._starts: deque[tuple[int, bool]] = deque(maxlen=cfg.ngram)
        self._wordy = 0  # words among the last n units
        # n-gram -> occurrences within the window; _expire holds them in order.
        self._seen_v: dict[tuple[str, ...], int] = {}
        self._seen_m: dict[tuple[str, ...], int] = {}
        self._expire: deque[tuple[tuple[str, ...], tuple[str, ...]]] = deque()
        self._s = 0.0
        self._run = 0  # onset of the current excursion of S above zero
        self.alarm: LoopAlarm | None = None
        self.peak = 0.0
        self.n_units = 0
        self.n_repeated = 0

    def feed(self, text: str, tokens: Sequence[TokenLogprob] | None = None) -> Stop | None:
        """Consume the next piece of the stream; return a stop once it loops."""
        if self.alarm is None:
            self._scan(text)
        return None if self.alarm is None else Stop("loop", keep=self.alarm.onset)

    def measures(self) -> None:
        return None

    def _scan(self, text: str) -> None:
        # _buf starts right after the last processed unit: the gap before the next
        # unit (whitespace, newlines) tells whether that unit starts a new step.
        buf = self._buf + text
        limit = len(buf) - 2  # a unit is final once two more chars are known ("3" -> "3.5")
        last = 0
        for m in _UNIT.finditer(buf):
            if m.end() > limit:
                break
            gap = buf[last : m.start()]
            step = "\n" in gap or (bool(gap) and self._prev in _TERMINATORS)
            last = m.end()
            if self._unit(m.group(), self._base + m.start(), step):
                return
        # Keep only the unprocessed tail: a gap and at most one unit. A long run of
        # whitespace is squeezed to one char (a newline if it had one), so the tail,
        # and the rescan of it on the next feed, stays short whatever the model emits.
        tail = buf[last:]
        if len(tail) > _LONG_GAP and tail[:_LONG_GAP].isspace():
            ws = len(tail) - len(tail.lstrip())
            squeezed = "\n" if "\n" in tail[:ws] else " "
            last += ws - 1
            tail = squeezed + tail[ws:]
        self._buf = tail
        self._base += last

    def _unit(self, u: str, start: int, step: bool) -> bool:
        n = self._n
        self._prev = u
        first = u[0]
        if first.isdigit():
            unit = (u, _NUM, False)
        else:
            word = first.isalpha()
            low = u.lower()
            unit = (low, low, word)
        units = self._units
        if len(units) == n:
            self._wordy -= units[0][2]
        units.append(unit)
        self._starts.append((start, step))
        self._wordy += unit[2]
        self.n_units += 1
        if len(units) < n:
            return False
        v = tuple(x[0] for x in units)
        m = tuple(x[1] for x in units)
        seen_v, seen_m = self._seen_v, self._seen_m
        repeated = v in seen_v or (m in seen_m and self._wordy >= self._min_words)
        self.n_repeated += repeated
        seen_v[v] = seen_v.get(v, 0) + 1
        seen_m[m] = seen_m.get(m, 0) + 1
        expire = self._expire
        expire.append((v, m))
        if len(expire) > self._window:
            ov, om = expire.popleft()
            if seen_v[ov] == 1:
                del seen_v[ov]
            else:
                seen_v[ov] -= 1
            if seen_m[om] == 1:
                del seen_m[om]
            else:
                seen_m[om] -= 1
        s = self._s + (1.0 if repeated else 0.0) - self._drift
        if s <= 0.0:
            self._s = 0.0
            return False
        if self._s == 0.0:
            # A new excursion: the copy began at the repeated n-gram's first unit. Cut
            # at the first step start inside the n-gram (all of it is repeated), so the
            # kept text ends with a whole sentence; with no step start in it (a loop
            # inside one line), cut at its first unit that is not closing punctuation.
            starts = self._starts
            i = next((j for j in range(n) if starts[j][1]), -1)
            if i < 0:
                i = 0
                while i < n - 1 and units[i][0] in _CLOSERS:
                    i += 1
            self._run = starts[i][0]
        self._s = s
        if s > self.peak:
            self.peak = s
        if s > self._h and self.n_units > self._warmup:
            self.alarm = LoopAlarm(onset=self._run, position=start + len(u))
            return True
        return False
