"""How ``OpenAIBackend`` reaches its upstreams: affinity, a concurrency cap and retries.

Several base URLs share the calls (a cluster of vLLM servers without a router):
calls with the same affinity (the Context sets the task's id) go to the same
upstream first, so all calls of one task hit one prefix cache; calls without one
go round-robin; a retry moves on to the next upstream. A semaphore caps the
requests in flight. Retries (tenacity, exponential backoff with jitter, never
shorter than a ``Retry-After``) cover 408/409/429/5xx and connection errors,
under the shared ``UpstreamGuard`` (``upstream_guard.py``): its retry budget,
its shared pause and its circuit breaker.

Example:
    >>> upstream_for("task-7", 3) == upstream_for("task-7", 3)
    True
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import openai
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from refinery.engine.backends.upstream_guard import (
    BUDGET_SPENT,
    RetryDecision,
    UpstreamGuard,
    retry_after_seconds,
    retryable,
    upstream_error,
)
from refinery.engine.errors import BackendUnavailableError

if TYPE_CHECKING:
    from refinery.engine.backends.openai import OpenAIConfig

__all__ = ["UpstreamPool", "upstream_for"]

T = TypeVar("T")


def upstream_for(affinity: str, upstreams: int) -> int:
    """The index of the upstream that every call with ``affinity`` goes to first: the
    same in every process (a server replica, a client), since it hashes the text."""
    return zlib.crc32(affinity.encode()) % upstreams


class UpstreamPool:
    """The clients of one backend and the one way to call them (``call``).

    ``clock`` is the monotonic time of the retry deadlines and the breaker.
    """

    def __init__(self, clients: Sequence[openai.AsyncOpenAI], config: OpenAIConfig,
                 served_model: str, clock: Callable[[], float]) -> None:
        self.clients = list(clients)
        self.config = cfg = config
        self.served_model = served_model
        self._next = itertools.cycle(range(len(self.clients)))
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._backoff = wait_exponential_jitter(multiplier=cfg.backoff_initial,
                                                max=cfg.backoff_max, jitter=cfg.backoff_initial)
        self.guard = UpstreamGuard(budget=cfg.retry_budget,
                                   breaker_threshold=cfg.breaker_threshold,
                                   breaker_cooldown=cfg.breaker_cooldown, clock=clock)

    def first(self, affinity: str | None) -> int:
        """The upstream a call with ``affinity`` tries first (round-robin without one)."""
        if affinity is None:
            return next(self._next)
        return upstream_for(affinity, len(self.clients))

    async def call(self, fn: Callable[[openai.AsyncOpenAI], Awaitable[T]],
                   affinity: str | None = None) -> T:
        """Run ``fn(client)`` under the concurrency cap with the retry policy, on the
        upstream ``affinity`` picks (each retry on the next one).

        Raises:
            BackendUnavailableError: the upstream stayed unreachable or overloaded
                (retries exhausted, retry budget spent, or the circuit is open).
            BackendError: the upstream failed in a way a retry cannot fix.
            InvalidRequestError: the upstream rejected the request (400).
            UnknownModelError: the upstream does not serve the model.
        """
        guard, cfg = self.guard, self.config
        deadline = guard.clock() + cfg.max_retry_seconds
        retry = RetryDecision(guard, deadline, cfg.max_retry_after)
        upstreams = itertools.count(self.first(affinity))
        try:
            async with self._sem:
                async for attempt in AsyncRetrying(
                        retry=retry_if_exception(retry),
                        stop=(stop_after_attempt(cfg.max_retries + 1)
                              | stop_after_delay(cfg.max_retry_seconds)),
                        wait=self._wait, reraise=True):
                    with attempt:
                        await self._hold_off(deadline)
                        guard.admit()
                        client = self.clients[next(upstreams) % len(self.clients)]
                        return await self._attempt(fn, client)
        except (openai.APIConnectionError, openai.APIStatusError) as exc:
            if retry.why_stopped == BUDGET_SPENT:
                guard.retries_denied += 1
            raise upstream_error(exc, self.served_model, retry.why_stopped) from exc
        raise AssertionError("unreachable: tenacity returns or reraises")

    async def _attempt(self, fn: Callable[[openai.AsyncOpenAI], Awaitable[T]],
                       client: openai.AsyncOpenAI) -> T:
        """One attempt, its outcome told to the guard."""
        try:
            result = await fn(client)
        except Exception as exc:
            if retryable(exc):
                self.guard.failure(exc)
            raise
        self.guard.success()
        return result

    def _wait(self, state: RetryCallState) -> float:
        """Jittered exponential backoff, but never shorter than ``Retry-After``."""
        wait = self._backoff(state)
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_seconds(exc) if exc is not None else None
        if asked is not None:
            wait = max(wait, min(asked, self.config.max_retry_after))
        return wait

    async def _hold_off(self, deadline: float) -> None:
        """Wait out a ``Retry-After`` another call got (everyone holds off), or fail
        at once when it ends past this call's retry deadline."""
        pause = self.guard.pause_left()
        if pause > deadline - self.guard.clock():
            raise BackendUnavailableError(
                f"upstream asked to retry after {pause:.0f}s, past this "
                f"call's retry deadline (last: {self.guard.last_error})",
                code="upstream_rate_limited")
        if pause:
            await asyncio.sleep(pause)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.close()
