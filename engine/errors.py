"""The one exception hierarchy of refinery.

Code raises these anywhere; only the server boundary turns them into an
OpenAI error body (``{"error": {"message", "type", "param", "code"}}``) with
``status``. Everything else (CLI, eval runner) prints ``str(exc)``.

    RefineryError                       500 internal_error
    ├── InvalidRequestError             400 invalid_request_error
    │   ├── SpecError                   400   bad strategy spec / parameter
    │   ├── PromptTooLongError          400   prompt over the context window
    │   ├── BudgetError                 400   budget asked for exceeds the cap
    │   └── RequestTooLargeError        413   request body over the server's limit
    ├── AuthenticationError             401 authentication_error
    ├── NotFoundError                   404 not_found_error
    │   └── UnknownModelError           404   lists the known models
    ├── OverCapacityError               429 rate_limit_error   too many requests in flight
    ├── BudgetExhausted                 400 budget_exhausted   a strategy ran out of budget
    │                                         (strategies catch it and keep their best attempt)
    ├── BackendError                    502 backend_error      upstream/engine failed a request
    │   └── BackendUnavailableError     503 service_unavailable  engine not ready or dead
    │       └── EngineStartError        503   engine failed to start (memory hints)
    ├── SandboxError                    500 internal_error     the code sandbox itself failed
    └── StorageError (also OSError)     500 storage_error      a result/trace line could not
                                              be written (disk full, read-only)

Subclasses that belong to one layer live there: ``UnsupportedConstraintError``
(engine/constraints.py) and ``ContinuationUnsupportedError`` (engine/backends/base.py,
a backend that cannot continue a partial assistant turn), ``PartialAttempts`` and
``PartialScores`` (BudgetExhausted carrying what a phase got, strategies/base.py),
``DatasetError``, ``ConfigMismatchError``, ``RunAborted`` and ``StrategyCrash``
(eval), ``DistillError`` (distill). Callers decide by ``isinstance`` on these
classes, never by the text of a message.
"""

from __future__ import annotations


class RefineryError(Exception):
    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class InvalidRequestError(RefineryError):
    status = 400
    type = "invalid_request_error"


class SpecError(InvalidRequestError):
    """A strategy spec that does not parse, names an unknown strategy, or has a bad parameter."""


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus max_tokens) does not fit the model's context window."""


class BudgetError(InvalidRequestError):
    """A requested budget is larger than the server allows, or a spec's worst case is."""


class RequestTooLargeError(InvalidRequestError):
    """A request body over the server's size limit."""

    status = 413


class AuthenticationError(RefineryError):
    status = 401
    type = "authentication_error"


class NotFoundError(RefineryError):
    status = 404
    type = "not_found_error"


class UnknownModelError(NotFoundError):
    """A model name that is neither registered nor a local directory."""


class OverCapacityError(RefineryError):
    status = 429
    type = "rate_limit_error"


class BudgetExhausted(RefineryError):
    """Raised by Context when a call would exceed the budget; strategies catch it
    and return their best attempt so far."""

    status = 400
    type = "budget_exhausted"


class BackendError(RefineryError):
    status = 502
    type = "backend_error"


class BackendUnavailableError(BackendError):
    status = 503
    type = "service_unavailable"


class EngineStartError(BackendUnavailableError):
    """The inference engine could not start."""


class SandboxError(RefineryError):
    """The sandbox could not run at all (not: the candidate failed)."""


class StorageError(RefineryError, OSError):
    """A result or trace line could not be written whole (disk full, read-only, quota).

    Also an ``OSError`` so callers that guard file I/O keep catching it; the
    message names the file and the cause, and nothing was half-written.
    """

    type = "storage_error"
