"""What stands between an overloaded upstream and more load: retries that share a
budget, a shared ``Retry-After`` pause and a circuit breaker.

One :class:`UpstreamGuard` per backend is shared by all its requests:

- a retry budget (gRPC-style retry throttling): every failed attempt costs a
  token, every success earns back a fraction of one, and retries stop while
  the bucket is at or below half full. N concurrent requests against a storm
  therefore cost about N attempts plus the budget, not N x max attempts;
- ``Retry-After`` (or ``retry-after-ms``) pauses every request, not only the
  one that got it, and a pause longer than the retry deadline fails at once;
- a circuit breaker: after ``breaker_threshold`` consecutive failures the
  backend refuses calls for ``breaker_cooldown`` seconds without touching the
  upstream.

Time comes from the guard's ``clock`` (``time.monotonic`` unless a test passes
its own), so a test moves time instead of sleeping through a cooldown.

Example:
    >>> guard = UpstreamGuard(breaker_threshold=2, breaker_cooldown=5.0)
    >>> guard.failure(RuntimeError("502")); guard.failure(RuntimeError("502"))
    >>> guard.is_open
    True
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import Callable

import httpx
import openai

from refinery.engine.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    PromptTooLongError,
    RefineryError,
    UnknownModelError,
)

try:  # the transport of openai>=2.x; older SDKs use httpx itself
    import httpx2

    TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, httpx2.HTTPError)
except ImportError:  # pragma: no cover - depends on the installed SDK
    TRANSPORT_ERRORS = (httpx.HTTPError,)

__all__ = ["RetryDecision", "UpstreamGuard", "describe", "retry_after_seconds", "retryable",
           "upstream_error"]

log = logging.getLogger(__name__)

BUDGET_SPENT = "with the shared retry budget spent (not retried)"

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def retryable(exc: BaseException) -> bool:
    """Whether a retry can fix ``exc``: a connection error, a timeout, 408/409/429/5xx."""
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in RETRY_STATUS


def retry_after_seconds(exc: BaseException) -> float | None:
    """The delay an error response asks for (``retry-after-ms`` or ``Retry-After``).

    Args:
        exc: the exception of a failed attempt.

    Returns:
        Seconds to wait, or None when the response carries no usable header.
    """
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            value = float(ms) / 1000
            return value if math.isfinite(value) and value >= 0 else None
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        # RFC 9110 also allows an HTTP date.
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return value if math.isfinite(value) and value >= 0 else None


class UpstreamGuard:
    """Retry budget, shared Retry-After pause and circuit breaker of one backend.

    All requests of a backend share one guard, which is what keeps retries
    from multiplying load: the budget caps retries across requests, not per
    request.

    Args:
        budget: tokens in the retry bucket; retries are allowed while more
            than half remain (0 disables retries altogether).
        token_ratio: tokens a successful call puts back.
        breaker_threshold: consecutive failed attempts that open the circuit.
        breaker_cooldown: seconds the open circuit refuses calls.
        clock: monotonic time source (tests may pass their own).
    """

    def __init__(self, budget: float = 20.0, token_ratio: float = 0.1,
                 breaker_threshold: int = 10, breaker_cooldown: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.max_tokens = float(budget)
        self.tokens = float(budget)
        self.token_ratio = token_ratio
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.clock = clock
        self.consecutive_failures = 0
        self.open_until = 0.0
        self.pause_until = 0.0
        self.last_error = ""
        # Whether the last failure was "cannot connect" (a health probe that gets
        # through proves that wrong) rather than "answered with an error" (a probe
        # proves nothing: /models answers fine during a 429 storm).
        self.unreachable = False
        # Counters for metrics and tests: what the guard let through or refused.
        self.attempts = 0
        self.retries_denied = 0
        self.short_circuited = 0

    @property
    def is_open(self) -> bool:
        return self.clock() < self.open_until

    def admit(self) -> None:
        """Raise instead of calling the upstream while the circuit is open.

        Raises:
            BackendUnavailableError: the circuit is open.
        """
        now = self.clock()
        if now < self.open_until:
            self.short_circuited += 1
            raise BackendUnavailableError(
                f"upstream unavailable: circuit open for {self.open_until - now:.1f}s more "
                f"after {self.consecutive_failures} consecutive failures "
                f"(last: {self.last_error})", code="upstream_circuit_open")
        self.attempts += 1

    def success(self) -> None:
        self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)
        self.consecutive_failures = 0
        self.open_until = 0.0
        self.unreachable = False

    def reachable(self) -> None:
        """A health probe got through: close a circuit opened for unreachability."""
        if self.unreachable:
            self.unreachable = False
            self.consecutive_failures = 0
            self.open_until = 0.0

    def failure(self, exc: BaseException) -> None:
        """Record a failed attempt (an upstream error, not the caller's mistake)."""
        self.tokens = max(0.0, self.tokens - 1)
        self.consecutive_failures += 1
        self.last_error = describe(exc)
        self.unreachable = isinstance(exc, (openai.APIConnectionError, *TRANSPORT_ERRORS))
        delay = retry_after_seconds(exc)
        if delay:
            self.pause_until = max(self.pause_until, self.clock() + delay)
        if self.consecutive_failures >= self.breaker_threshold:
            self.trip()

    def trip(self) -> None:
        """Open the circuit for the cooldown (also used by a failed health probe)."""
        if not self.is_open:
            log.warning("upstream circuit opened for %.1fs after %d consecutive failures: %s",
                        self.breaker_cooldown, self.consecutive_failures, self.last_error)
        self.open_until = self.clock() + self.breaker_cooldown

    def retry_allowed(self) -> bool:
        """Whether the shared budget allows a retry (more than half of it left)."""
        return self.tokens > self.max_tokens / 2

    def pause_left(self) -> float:
        return max(0.0, self.pause_until - self.clock())


def describe(exc: BaseException) -> str:
    """One line for an upstream failure, as /health and error messages show it."""
    if isinstance(exc, openai.APIStatusError):
        return f"{exc.status_code} {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class RetryDecision:
    """Whether one call retries after a failed attempt; ``why_stopped`` says why not.

    A pure predicate over the guard's state and its clock: the failure itself is
    recorded by the caller (``UpstreamGuard.failure``) before it asks, so asking
    twice changes nothing.
    """

    def __init__(self, guard: UpstreamGuard, deadline: float, max_retry_after: float) -> None:
        self.guard, self.deadline, self.max_retry_after = guard, deadline, max_retry_after
        self.why_stopped = "after retries"

    def __call__(self, exc: BaseException) -> bool:
        if not retryable(exc):
            return False
        asked = retry_after_seconds(exc) or 0.0
        if min(asked, self.max_retry_after) > self.deadline - self.guard.clock():
            self.why_stopped = f"and asked to retry after {asked:.0f}s, past the retry deadline"
            return False
        if self.guard.is_open:
            self.why_stopped = "and the circuit breaker opened"
            return False
        if not self.guard.retry_allowed():
            self.why_stopped = BUDGET_SPENT
            return False
        return True


def upstream_error(exc: openai.APIConnectionError | openai.APIStatusError, model: str,
                    why_stopped: str) -> RefineryError:
    """The refinery error for an upstream failure that the retries did not fix."""
    if isinstance(exc, openai.APIConnectionError):
        return BackendUnavailableError(f"upstream unreachable {why_stopped}: {exc}")
    if isinstance(exc, openai.NotFoundError):
        return UnknownModelError(f"upstream does not serve {model!r}: {exc.message}",
                                 param="model")
    if isinstance(exc, openai.BadRequestError):
        msg = exc.message or str(exc)
        # OpenAI sends the code; vLLM's server only says it in the message.
        if exc.code == "context_length_exceeded" or (
                "context" in msg.lower() and "length" in msg.lower()):
            return PromptTooLongError(msg, param="messages", code="context_length_exceeded")
        return InvalidRequestError(msg)
    cls = BackendUnavailableError if exc.status_code in RETRY_STATUS else BackendError
    return cls(f"upstream answered {exc.status_code} {why_stopped}: {exc.message}")
