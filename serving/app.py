"""The FastAPI app, assembled from the server's parts.

``routes`` (thin routes), ``dependencies`` (auth, capacity), ``errors`` (the
one exception-to-OpenAI-body mapping), ``middleware`` (body limit),
``supervisor`` (engine start and death policy), ``serve`` (the one serve path)
and ``state`` (the typed state on ``app.state.server``).

Example:
    >>> app = create_app(ServerConfig(), backend_factory=lambda: VLLMBackend.create())
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

from fastapi import FastAPI

from refinery.engine.backends.base import Backend
from refinery.serving.config import ServerConfig
from refinery.serving.errors import register_error_handlers
from refinery.serving.middleware import BodyLimit
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
    register_error_handlers(app)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.include_router(router)
    return app


__all__ = ["create_app"]
