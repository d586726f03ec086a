"""The FastAPI app, assembled from the server's parts.

``routes`` (thin routes), ``dependencies`` (auth, login sessions, capacity),
``errors`` (the one exception-to-OpenAI-body mapping), ``middleware`` (body
limit, Host, origin and content-type checks, security headers),
``supervisor`` (engine start and death policy), ``serve`` (the one serve path)
and ``state`` (the typed state on ``app.state.server``).

Example:
    >>> app = create_app(ServerConfig(), backend_factory=VLLMBackend.create)  # doctest: +SKIP
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI

from refinery.engine.backends.base import Backend
from refinery.serving.config import ServerConfig
from refinery.serving.dependencies import Sessions
from refinery.serving.errors import register_error_handlers
from refinery.serving.middleware import guard
from refinery.serving.routes import router
from refinery.serving.state import ServerState
from refinery.serving.supervisor import BackendFactory, EngineSupervisor


def create_app(config: ServerConfig | None = None, *, backend: Backend | None = None,
               backend_factory: BackendFactory | None = None) -> FastAPI:
    """Build the app over ``backend``, or over the one ``backend_factory`` builds.

    With ``backend_factory`` the engine starts in the background (/health answers
    503 until it is ready), is supervised by ``config.on_engine_death`` and is
    closed with the app; a ``backend`` given as is stays the caller's to close.

    The runner sets ``app.state.stop_server`` (a callable) so that a dead engine
    can stop it, and reads ``app.state.engine_died`` after it stopped.
    """
    config = config or ServerConfig()
    state = ServerState.create(config, backend)
    lifespan = None
    if backend_factory is not None:
        lifespan = EngineSupervisor(state.service, config, backend_factory).lifespan
    app = FastAPI(title="refinery", version="0.1.0", lifespan=lifespan)
    app.state.server = state
    app.state.stop_server = None
    app.state.engine_died = False
    app.state.sessions = Sessions()
    register_error_handlers(app)
    guard(app, max_body_bytes=config.max_body_bytes, allowed_hosts=config.allowed_hosts)
    app.include_router(router)
    redact_access_log()
    return app


# A query parameter that may hold a credential, and its value (up to the next & or space).
SECRET_PARAM = re.compile(r"([?&](?:key|api_key|access_token|token)=)[^&\s\"]*", re.IGNORECASE)


class RedactSecrets(logging.Filter):
    """Blank credential-like query parameters in a log record's arguments (uvicorn's
    access log writes each request's path with its query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(SECRET_PARAM.sub(r"\1[redacted]", a) if isinstance(a, str)
                                else a for a in record.args)
        return True


def redact_access_log(logger: str = "uvicorn.access") -> None:
    """Install :class:`RedactSecrets` on ``logger`` once (uvicorn keeps a logger's filters
    when it configures logging)."""
    log = logging.getLogger(logger)
    if not any(isinstance(f, RedactSecrets) for f in log.filters):
        log.addFilter(RedactSecrets())


__all__ = ["RedactSecrets", "create_app", "redact_access_log"]
