"""Fixtures of the server tests.

Fast tests: ``scripted_serve`` starts the app on a real uvicorn on loopback
over a :class:`ScriptedBackend` (no model), so the whole HTTP layer runs in
``make test-fast``. The fuzz and hostile-input (e2e) tests: re-exports the e2e
``serve`` factory (a real uvicorn server in the session loop over the
session's one real vLLM engine) and adds :class:`CountingBackend`, a delegate
around the real backend that counts model calls, so a test can prove a
request was refused before any model call.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.tool_calls import Call, CallDelta
from refinery.engine.types import Completion, Delta, Message, SamplingParams
from refinery.serving import ServerConfig, create_app
from tests.e2e.conftest import serve  # noqa: F401  (the fixture)
from tests.scripted_backend import ScriptedBackend
from tests.servers import LoopServers

ERROR_KEYS = {"message", "type", "param", "code"}
MODEL = DEFAULT_MODEL
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
QUESTION = [{"role": "user", "content": "2+2?"}]
ANSWER = "The answer is 4."


def scripted(**knobs: Any) -> ScriptedBackend:
    """A backend answering every prompt with ``ANSWER`` (knobs: ``hang_after``...)."""
    return ScriptedBackend([(r".*", ANSWER)], **knobs)


def chat(**fields: Any) -> dict:
    """A chat request body for the served model, with ``fields`` set."""
    return {"model": MODEL, "messages": QUESTION, **fields}


def sse_data(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded except ``[DONE]``."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.fixture
async def scripted_serve():
    """A factory: ``url, app = await scripted_serve(config, backend=...)``.

    The app runs on a real uvicorn on 127.0.0.1 in the test loop (lifespan,
    disconnects and streaming as in production); without ``backend`` or
    ``backend_factory`` it serves ``scripted()``. All are stopped after the test.
    """
    servers = LoopServers()

    async def make(config: ServerConfig | None = None,
                   **app_kwargs: Any) -> tuple[str, FastAPI]:
        if "backend_factory" not in app_kwargs:
            app_kwargs.setdefault("backend", scripted())
        app = create_app(config or ServerConfig(), **app_kwargs)
        return await servers.start(app), app

    yield make
    await servers.stop()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=20) as http:
        yield http


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
                       n: int | None = None, stop_rule: Any = None) -> list[Completion]:
        self.calls += 1
        return await self.inner.generate(messages, params, n=n, stop_rule=stop_rule)

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               stop_rule: Any = None) -> AsyncIterator[Delta]:
        self.calls += 1
        return self.inner.stream(messages, params, stop_rule=stop_rule)

    async def aclose(self) -> None:
        """Never closes the shared session engine (the session fixture does)."""


class PartsBackend:
    """A scripted backend whose completions come split into parts, as a backend with a
    reasoning parser and a native tool-call parser reports them.

    ``thought``: every completion's ``reasoning`` (one token a word, counted in
    ``completion_tokens`` and ``reasoning_tokens``), streamed word by word as
    ``Delta.reasoning`` before the answer. ``calls``: the native calls of every
    completion asked with ``params.tools`` whose final message matches ``when``
    (its text is then ``beside``), streamed after the text as ``CallDelta``s (the name,
    then the arguments JSON in two pieces). ``tool_call_parser`` names the parser the
    server reads (None: the backend parses no calls).
    """

    def __init__(self, inner: ScriptedBackend, thought: str | None = None,
                 calls: Sequence[Call] = (), when: str = ".", beside: str = "",
                 tool_call_parser: str | None = None):
        self.inner, self.thought, self.calls = inner, thought, list(calls)
        self.when, self.beside, self.tool_call_parser = when, beside, tool_call_parser
        self.tokens = len(thought.split()) if thought else 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def calling(self, messages: Sequence[Message], params: SamplingParams) -> bool:
        return bool(self.calls and params.tools and re.search(self.when, messages[-1].content))

    def split(self, comp: Completion, calling: bool) -> Completion:
        update: dict[str, Any] = {"tool_calls": self.calls, "text": self.beside} \
            if calling else {}
        if self.thought:
            update |= {"reasoning": self.thought, "reasoning_tokens": self.tokens,
                       "completion_tokens": comp.completion_tokens + self.tokens}
        return comp.model_copy(update=update)

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None, **kw: Any) -> list[Completion]:
        calling = self.calling(messages, params)
        return [self.split(c, calling)
                for c in await self.inner.generate(messages, params, n=n, **kw)]

    async def stream(self, messages: Sequence[Message], params: SamplingParams,
                     **kw: Any) -> AsyncIterator[Delta]:
        calling = self.calling(messages, params)
        for j, word in enumerate((self.thought or "").split()):
            yield Delta(reasoning=word if j == 0 else " " + word)
        async for delta in self.inner.stream(messages, params, **kw):
            if delta.completion is None:
                if not calling:
                    yield delta
                continue
            if calling:
                if self.beside:
                    yield Delta(text=self.beside)
                for j, call in enumerate(self.calls):
                    args = call.arguments_json
                    yield Delta(tool_calls=[CallDelta(j, call.name)])
                    yield Delta(tool_calls=[CallDelta(j, arguments=args[:5]),
                                            CallDelta(j, arguments=args[5:])])
            yield delta.model_copy(update={"completion": self.split(delta.completion,
                                                                     calling)})


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
