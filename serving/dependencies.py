"""FastAPI dependencies of the routes: the server state, auth and capacity.

Example:
    >>> @router.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    ... async def chat(req: ChatCompletionRequest, _: None = Depends(admit)): ...
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request

from refinery.engine.errors import AuthenticationError
from refinery.serving.state import ServerState


def server_state(request: Request) -> ServerState:
    """The app's :class:`ServerState` (set by ``create_app``)."""
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]


KEY_COOKIE = "refinery_key"  # set by the web page's login (refinery.ui.auth), HttpOnly


def presented_keys(request: Request) -> list[str]:
    """The API keys a request carries: its ``Authorization: Bearer`` key, then its cookie.

    A browser cannot add a bearer header to a page load, so the web page's login
    keeps the key in an HttpOnly, SameSite=Strict cookie; the API accepts it too
    (the page's own ``fetch`` calls), and no other site can make a browser send it.
    """
    header = request.headers.get("authorization", "")
    keys = [header[7:]] if header.lower().startswith("bearer ") else []
    cookie = request.cookies.get(KEY_COOKIE)
    return [*keys, cookie] if cookie else keys


def key_accepted(token: str, keys: frozenset[str]) -> bool:
    """Whether ``token`` is one of ``keys``, compared in constant time against each."""
    ok = False
    for key in keys:  # every key, without early exit
        ok |= hmac.compare_digest(token.encode(), key.encode())
    return ok


def check_key(request: Request, keys: frozenset[str]) -> None:
    """Refuse a request that carries none of ``keys`` (no keys configured: open).

    Raises:
        AuthenticationError: no bearer header or cookie with a known key.
    """
    if keys and not any(key_accepted(t, keys) for t in presented_keys(request)):
        raise AuthenticationError("invalid or missing API key", code="invalid_api_key")


async def authorize(request: Request, state: State) -> None:
    """Refuse a request without one of the server's API keys (none configured: open).

    Raises:
        AuthenticationError: no ``Authorization: Bearer KEY`` header (or the web
            page's cookie) with a known key.
    """
    check_key(request, state.config.api_keys)


async def admit(state: State) -> AsyncIterator[None]:
    """Hold a capacity slot for the whole request, a stream until its last event.

    FastAPI runs the code after ``yield`` once the response has been sent, so a
    streamed response keeps its slot until its stream ends or the client leaves.

    Raises:
        OverCapacityError: the server is at ``max_concurrent_requests``.
    """
    with state.capacity.slot():
        yield
