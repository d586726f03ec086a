"""The server boundary of the exception hierarchy: every error leaves as an OpenAI body.

Code inside raises the errors of ``refinery.engine.errors``; ``openai_error``
is the one place that turns an exception into ``(status, body)``, decided by
the exception's type (never its message), and ``register_error_handlers``
installs it for every kind of failure a request can meet.

Example:
    >>> openai_error(UnknownModelError("no such model", param="model"))
    (404, ErrorResponse(error=ErrorInfo(message='no such model', type='not_found_error', ...)))
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from refinery.engine.errors import (
    InvalidRequestError,
    NotFoundError,
    RefineryError,
    RequestTooLargeError,
)
from refinery.serving.protocol import ErrorInfo, ErrorResponse

log = logging.getLogger(__name__)


def openai_error(exc: BaseException) -> tuple[int, ErrorResponse]:
    """The HTTP status and OpenAI error body for ``exc``.

    Args:
        exc: A refinery error, a request that failed validation, an HTTP error
            raised by Starlette (unknown route, wrong method, body over the
            limit), or anything else (a 500 that names only the exception type).

    Returns:
        The status and ``{"error": {"message", "type", "param", "code"}}``.
    """
    if isinstance(exc, RequestValidationError):
        exc = validation_error(exc)
    elif isinstance(exc, StarletteHTTPException):
        return exc.status_code, body(http_error(exc))
    elif not isinstance(exc, RefineryError):
        return 500, body(RefineryError(f"internal error: {type(exc).__name__}"))
    return exc.status, body(exc)


def body(exc: RefineryError) -> ErrorResponse:
    # A message quoting client text could hold a lone surrogate, which UTF-8 cannot
    # encode: escape it, or rendering the error would itself fail with a 500.
    message = exc.message.encode("utf-8", "backslashreplace").decode("utf-8")
    return ErrorResponse(error=ErrorInfo(message=message, type=exc.type, param=exc.param,
                                         code=exc.code))


def validation_error(exc: RequestValidationError) -> InvalidRequestError:
    """A request the schema refused: the first five problems, the first one's field."""
    errs = exc.errors()

    def where(err: dict) -> str:
        return ".".join(str(p) for p in err.get("loc", ()) if p != "body")

    message = "; ".join(f"{where(e)}: {e.get('msg')}" for e in errs[:5])
    return InvalidRequestError(message or "invalid request",
                               param=(where(errs[0]) if errs else "") or None)


def http_error(exc: StarletteHTTPException) -> RefineryError:
    """Starlette's own refusals as refinery errors (their status is kept by the caller)."""
    cls = {404: NotFoundError, 413: RequestTooLargeError}.get(exc.status_code,
                                                              InvalidRequestError)
    return cls(str(exc.detail))


def error_response(exc: BaseException) -> JSONResponse:
    """``exc`` as the JSON response a client gets."""
    status, content = openai_error(exc)
    return JSONResponse(content.model_dump(mode="json"), status_code=status)


async def handle(request: Request, exc: Exception) -> JSONResponse:
    if not isinstance(exc, (RefineryError, RequestValidationError, StarletteHTTPException)):
        log.exception("unhandled error", exc_info=exc)
    return error_response(exc)


def register_error_handlers(app: FastAPI) -> None:
    """Answer every failure in the OpenAI schema, never FastAPI's default shapes."""
    for kind in (RefineryError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, handle)
