"""Fixtures for the server's fuzz and hostile-input tests.

Re-exports the e2e ``serve`` factory (a real uvicorn server in the session loop
over the session's one real vLLM engine) and adds :class:`CountingBackend`, a
delegate around the real backend that counts model calls, so a test can prove
a request was refused before any model call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from refinery.engine.types import Completion, Delta, Message, SamplingParams

from tests.e2e.conftest import serve  # noqa: F401  (the fixture, re-registered here)

ERROR_KEYS = {"message", "type", "param", "code"}


class CountingBackend:
    """The real backend, with a count of the model calls made through it.

    Everything that is not a model call (``count_tokens``, ``max_model_len``,
    ``healthy``...) is forwarded unchanged, so the server behaves exactly as
    over the bare backend.
    """

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None, monitor: Any = None) -> list[Completion]:
        self.calls += 1
        return await self.inner.generate(messages, params, n=n, monitor=monitor)

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               monitor: Any = None) -> AsyncIterator[Delta]:
        self.calls += 1
        return self.inner.stream(messages, params, monitor=monitor)

    async def aclose(self) -> None:
        """Never closes the shared session engine (the session fixture does)."""


def assert_openai_error(body: Any, status: int | None = None) -> dict:
    """Check ``body`` is ``{"error": {"message", "type", "param", "code"}}``; return it.

    Args:
        body: The decoded JSON body of an error response.
        status: Unused by the check; kept so failures print the status beside the body.

    Returns:
        The inner ``error`` object.
    """
    assert isinstance(body, dict) and set(body) == {"error"}, (status, body)
    err = body["error"]
    assert isinstance(err, dict) and set(err) == ERROR_KEYS, (status, body)
    assert isinstance(err["message"], str) and err["message"], (status, body)
    assert isinstance(err["type"], str) and err["type"], (status, body)
    assert err["param"] is None or isinstance(err["param"], str), (status, body)
    assert err["code"] is None or isinstance(err["code"], (str, int)), (status, body)
    return err


@pytest.fixture(scope="session")
def counting_backend(vllm_backend) -> CountingBackend:
    """One counting delegate over the session's real engine."""
    return CountingBackend(vllm_backend)
