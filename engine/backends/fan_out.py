"""The fan-out of one call's ``n`` samples under a stop rule, written once for every backend.

A sample a stop rule ends early must be stopped alone, so under a rule each
sample is its own request, streamed through ``WatchedStream`` (engine/stops.py);
a call that may instead run as one n-sample request is checked sample by sample
once the request ends (``may_check_after_end`` says when, and why). Without a
rule a call is one request. A backend hands ``fan_out`` its two ways of running
samples; the n check, the choice between them and the draining are here.

Example:
    >>> comps = await fan_out(n, rule, params, backend.whole_check_max_tokens,  # doctest: +SKIP
    ...                       one_request=run_n, one_stream=stream_sample)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from refinery.engine.errors import InvalidRequestError
from refinery.engine.stops import StopRule, WatchedSample
from refinery.engine.types import Completion, Delta, SamplingParams

__all__ = ["checked_whole", "fan_out", "last_completion", "may_check_after_end"]


def may_check_after_end(rule: StopRule, params: SamplingParams, n: int,
                        limit: int | None) -> bool:
    """Whether a call of ``n`` samples under ``rule`` may run as one n-sample
    request whose samples are each checked whole once it ends, instead of one
    streamed request per sample.

    Why: a streamed sample is its own request (behind a server, one SSE chunk a
    token), while one request of n samples shares its prompt and its transport.
    For a rule that stops a whole text where it stops the same text streamed
    (``rule.stops_whole_as_streamed``: the CUSUM loop detector), checking after
    the end gives the same text, cut and finish reason; only the tokens past a
    stop are spent, since nothing aborts the sample there. So only up to
    ``limit`` tokens (None: never): a looping sample then runs to
    ``max_tokens``, and long calls lose more tokens than one request saves
    (figures: docs/benchmarks.md, ``bench/whole_check.py``). Never for n > 1
    greedy samples, which vLLM refuses in one request.

    Example:
        >>> from refinery.engine.loops import CusumLoopDetector
        >>> may_check_after_end(CusumLoopDetector(), SamplingParams(max_tokens=128), 5, 128)
        True
    """
    return (limit is not None and params.max_tokens <= limit and rule.stops_whole_as_streamed
            and (n == 1 or params.temperature > 0))


def checked_whole(comp: Completion, rule: StopRule | None) -> Completion:
    """A finished sample as ``rule`` (if any) judges its whole text: cut where a
    stop keeps less, the stop's finish reason; its tokens past the stop were
    generated, so ``completion_tokens`` still counts them.

    Example:
        >>> from refinery.engine.loops import CusumLoopDetector
        >>> text = "First add 3 and 4 to get 7. " + "Then we add 3 and 4 again. " * 12
        >>> c = checked_whole(Completion(text=text, prompt_tokens=9, completion_tokens=128,
        ...                              finish_reason="length"), CusumLoopDetector())
        >>> c.finish_reason, c.text.count("Then we"), c.completion_tokens
        ('loop', 1, 128)
    """
    if rule is None:
        return comp
    watch = WatchedSample(rule)
    watch.add(comp.text)
    return comp.model_copy(update={
        "text": watch.text, "loop_onset": watch.onset, "measures": watch.measures(),
        "finish_reason": watch.stop.reason if watch.stop else comp.finish_reason})


async def last_completion(deltas: AsyncIterator[Delta]) -> Completion:
    """Drain one sample's stream; its last Delta carries the whole Completion."""
    last = None
    async for delta in deltas:
        last = delta
    assert last is not None and last.completion is not None
    return last.completion


async def fan_out(n: int, rule: StopRule | None, params: SamplingParams, limit: int | None, *,
                  one_request: Callable[[int], Awaitable[list[Completion]]],
                  one_stream: Callable[[int], AsyncIterator[Delta]]) -> list[Completion]:
    """The ``n`` samples of one call, in order.

    Args:
        n: samples wanted (at least 1, else ``InvalidRequestError``).
        rule: the call's stop rule, or None.
        params: the call's sampling parameters.
        limit: the backend's ``whole_check_max_tokens`` (``may_check_after_end``).
        one_request: ``one_request(n)``, the n finished samples of one request,
            in order, not yet checked by the rule.
        one_stream: ``one_stream(i)``, sample i streamed under the rule; its last
            Delta carries the Completion.
    """
    if n < 1:
        raise InvalidRequestError(f"n must be >= 1, got {n}", param="n")
    if rule is None or may_check_after_end(rule, params, n, limit):
        return [checked_whole(c, rule) for c in await one_request(n)]
    if n == 1:  # in this task: nothing to run beside it
        return [await last_completion(one_stream(0))]
    return list(await asyncio.gather(*(last_completion(one_stream(i)) for i in range(n))))
