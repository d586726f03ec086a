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


async def authorize(request: Request, state: State) -> None:
    """Refuse a request without one of the server's API keys (none configured: open).

    Raises:
        AuthenticationError: no ``Authorization: Bearer KEY`` header with a known key.
    """
    keys = state.config.api_keys
    if not keys:
        return
    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else ""
    # Compare against every key, in constant time each, without early exit.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(token.encode(), key.encode())
    if not ok:
        raise AuthenticationError("invalid or missing API key", code="invalid_api_key")


async def admit(state: State) -> AsyncIterator[None]:
    """Hold a capacity slot for the whole request, a stream until its last event.

    FastAPI runs the code after ``yield`` once the response has been sent, so a
    streamed response keeps its slot until its stream ends or the client leaves.

    Raises:
        OverCapacityError: the server is at ``max_concurrent_requests``.
    """
    with state.capacity.slot():
        yield
