"""The server boundary of the exception hierarchy: every error leaves as an OpenAI body.

Code inside raises the errors of ``refinery.engine.errors``; ``openai_error``
is the one place that turns an exception into ``(status, body)``, decided by
the exception's type (never its message), and ``register_error_handlers``
installs it for every kind of failure a request can meet.

Example:
    >>> from refinery.engine.errors import UnknownModelError
    >>> status, body = openai_error(UnknownModelError("no such model", param="model"))
    >>> status, body.error.type, body.error.param
    (404, 'not_found_error', 'model')
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

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
    """A request the schema refused: its first five problems, the first one's field.

    Locations are written as OpenAI writes a ``param`` (:func:`where`); a field that
    failed every branch of a union is reported for the branch the client meant
    (:func:`meant`), not once per branch.
    """
    found: dict[str, list[str]] = {}
    for err in meant(exc.errors()):
        found.setdefault(where(err.get("loc", ())), []).append(str(err.get("msg")))
    message = "; ".join(f"{loc or 'body'}: {' or '.join(msgs)}"
                        for loc, msgs in list(found.items())[:5])
    return InvalidRequestError(message or "invalid request",
                               param=next(iter(found), "") or None)


def meant(errors: Sequence[Any], start: int = 0) -> list[Any]:
    """The errors of the union branch the client meant, for each field that failed in
    a union: the branch that got deepest into the value (``input`` as a list of items,
    not as a string), then the one with the fewest errors; branches alike all stay.
    Unions inside the chosen branch are resolved the same way (``start``: where in
    the locations the search resumes)."""
    fields: dict[tuple, dict[tuple, list[Any]]] = {}
    for err in errors:
        loc = tuple(err.get("loc", ()))
        k = next((k for k in range(start, len(loc)) if is_branch(loc[k])), len(loc))
        fields.setdefault(loc[:k], {}).setdefault((k, loc[k:k + 1]), []).append(err)

    def reach(branch: list[Any]) -> tuple[int, int]:
        return max(len(e.get("loc", ())) for e in branch), -len(branch)

    out: list[Any] = []
    for branches in fields.values():
        best = max(reach(b) for b in branches.values())
        for (k, label), branch in branches.items():
            if reach(branch) == best:
                out += meant(branch, k + 1) if label else branch
    return out


# How pydantic names the branch of a union an error is in: a core type (``str``,
# ``none``...), a form with brackets or hyphens (``list[InputItem]``,
# ``literal['none','auto']``, ``function-after[...]``) or a model's class name.
CORE_TYPES = frozenset({"str", "int", "float", "bool", "bytes", "none", "dict", "list",
                        "set", "tuple", "any", "decimal", "date", "datetime", "url"})


def is_branch(part: object) -> bool:
    """Whether a loc element names a union branch, not a field (fields are snake_case)."""
    return isinstance(part, str) and (part in CORE_TYPES or part[:1].isupper()
                                      or any(c in part for c in "[]-(), "))


def where(loc: tuple | list) -> str:
    """A pydantic error location as OpenAI writes a ``param``: the body's field path
    without union branch names, list indexes in brackets.

    Example:
        >>> where(("body", "messages", 0, "content", "list[ContentPart]", 1))
        'messages[0].content[1]'
        >>> where(("body", "tool_choice", "literal['none','auto','required']"))
        'tool_choice'
    """
    parts = list(loc)
    out = ""
    for part in parts[1:] if parts[:1] == ["body"] else parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not is_branch(part):
            out += f".{part}" if out else str(part)
    return out


def renamed(exc: RefineryError, names: dict[str, str]) -> RefineryError:
    """``exc`` naming the field its request calls ``names[field]`` (a request in
    another form: Responses, legacy functions), where it names that field.

    Example:
        >>> renamed(InvalidRequestError("bad", param="messages[2].content"),
        ...         {"messages": "input"}).param
        'input[2].content'
    """
    if exc.param is not None:
        head = re.split(r"[.\[]", exc.param, maxsplit=1)[0]
        exc.param = names.get(head, head) + exc.param[len(head):]
    return exc


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
