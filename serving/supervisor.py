"""Engine supervision: start the backend in the background, apply ``on_engine_death``.

A server given a ``backend_factory`` answers /health with 503 until the
factory's backend is ready. When that backend says it is dead for good
(``Backend.dead``: the vLLM core process is gone), the policy applies:
``restart`` builds a new backend in place (at most ``max_engine_restarts``
times), ``exit`` (and a restart budget spent) stops the server through the
runner's ``app.state.stop_server`` and sets ``app.state.engine_died`` so the
runner exits non-zero. An unreachable upstream is not a death: it recovers.

Example:
    >>> supervisor = EngineSupervisor(service, config, factory)  # doctest: +SKIP
    >>> app = FastAPI(lifespan=supervisor.lifespan)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import FastAPI

from refinery.engine.backends.base import Backend
from refinery.serving.config import ServerConfig
from refinery.serving.service import Service

log = logging.getLogger(__name__)
BackendFactory = Callable[[], Awaitable[Backend]]


def stop_server(app: FastAPI) -> None:
    """Mark the engine dead for the runner and ask it (``refinery serve``) to stop."""
    app.state.engine_died = True
    if app.state.stop_server is not None:
        app.state.stop_server()


class EngineSupervisor:
    """Owns the backend a factory builds: its start, its death policy, its close."""

    def __init__(self, service: Service, config: ServerConfig, factory: BackendFactory):
        self.service = service
        self.config = config
        self.factory = factory
        self.restarts = 0

    async def start(self) -> None:
        """Build the backend; a failure is kept for /health to report."""
        try:
            self.service.backend = await self.factory()
        except Exception as exc:
            self.service.start_error = str(exc)
            log.error("engine failed to start: %s", exc)

    async def watch(self, app: FastAPI) -> None:
        """Poll the backend; when it is dead for good, restart it or stop the server."""
        while True:
            await asyncio.sleep(self.config.engine_check_seconds)
            backend = self.service.backend
            if backend is None or not backend.dead:
                continue
            if (self.config.on_engine_death == "restart"
                    and self.restarts < self.config.max_engine_restarts):
                await self.restart(backend)
                continue
            log.error("engine died; stopping the server (on_engine_death=%s)",
                      self.config.on_engine_death)
            stop_server(app)
            return

    async def restart(self, dead: Backend) -> None:
        self.restarts += 1
        log.error("engine died; restarting it (%d of %d)", self.restarts,
                  self.config.max_engine_restarts)
        self.service.backend = None  # /health says "starting" meanwhile
        try:
            await dead.aclose()
        except Exception as exc:  # the old engine is gone either way
            log.warning("closing the dead engine failed: %s", exc)
        await self.start()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Start and watch the engine while the app runs; close it when the app stops."""
        tasks = [asyncio.ensure_future(self.start()), asyncio.ensure_future(self.watch(app))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.service.backend is not None:
                await self.service.backend.aclose()
