"""ASGI middleware of the server: the request body size limit."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from refinery.engine.errors import RequestTooLargeError
from refinery.serving.errors import error_response


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a 413.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body (no length) is counted as it arrives and refused once over,
    so an endless upload cannot fill memory.

    Example:
        >>> app.add_middleware(BodyLimit, limit=4 * 1024 * 1024)
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            response = error_response(RequestTooLargeError(
                f"request body of {int(length)} bytes is over the limit of {self.limit}"))
            return await response(scope, receive, send)
        await self.app(scope, self.counted(receive), send)

    def counted(self, receive: Receive) -> Receive:
        """``receive``, refusing the body once more than ``limit`` bytes arrived."""
        seen = 0

        async def receive_counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Raised inside the route's body read: FastAPI re-raises an
                    # HTTPException as is (any other error would become a 400), and
                    # the error handlers answer it as the OpenAI 413 body.
                    raise StarletteHTTPException(413, f"request body is over the limit of "
                                                      f"{self.limit} bytes")
            return message

        return receive_counted
