"""How an upstream's failure becomes a refinery error: by the openai exception's
type and status (and OpenAI's ``code``), as the server boundary then maps it."""

from __future__ import annotations

import httpx
import openai
import pytest

from refinery.engine.backends.upstream_guard import upstream_error
from refinery.engine.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    PromptTooLongError,
    UnknownModelError,
)

REQUEST = httpx.Request("POST", "http://upstream/v1/chat/completions")


def _status(cls: type[openai.APIStatusError], status: int, message: str,
            code: str | None = None) -> openai.APIStatusError:
    body = {"message": message, "type": "invalid_request_error", "code": code}
    return cls(message, response=httpx.Response(status, request=REQUEST), body=body)


@pytest.mark.parametrize("exc, kind, status", [
    (_status(openai.NotFoundError, 404, "no model m"), UnknownModelError, 404),
    (_status(openai.BadRequestError, 400, "too long for this model",
             "context_length_exceeded"), PromptTooLongError, 400),
    # vLLM's server gives no code, only the message
    (_status(openai.BadRequestError, 400, "This model's maximum context length is 2048 "
             "tokens"), PromptTooLongError, 400),
    (_status(openai.BadRequestError, 400, "temperature must be <= 2"), InvalidRequestError,
     400),
    (_status(openai.InternalServerError, 503, "overloaded"), BackendUnavailableError, 503),
    (_status(openai.InternalServerError, 500, "boom"), BackendUnavailableError, 503),
    (_status(openai.UnprocessableEntityError, 422, "odd"), BackendError, 502),
    (openai.APIConnectionError(request=REQUEST), BackendUnavailableError, 503),
])
def test_upstream_failures_map_by_type_and_status(exc, kind, status):
    err = upstream_error(exc, "m", "after retries")
    assert type(err) is kind and err.status == status
    if kind is PromptTooLongError:
        assert err.code == "context_length_exceeded" and err.param == "messages"
    if kind is UnknownModelError:
        assert err.param == "model" and "'m'" in str(err)
    if kind in (BackendUnavailableError, BackendError):
        assert "after retries" in str(err)
