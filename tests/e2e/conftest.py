"""Real uvicorn servers on 127.0.0.1, in the test session's event loop, over the
session's one real vLLM engine (so tests can inspect the engine's state)."""

from __future__ import annotations

import pytest

from refinery.serving import ServerConfig, create_app
from tests.servers import LoopServers


@pytest.fixture(scope="session")
async def serve(vllm_backend):
    """A factory: ``url = await serve(ServerConfig(...))``; all stopped at session end."""
    servers = LoopServers()

    async def make(config: ServerConfig | None = None, **app_kwargs) -> str:
        if "backend_factory" not in app_kwargs:
            app_kwargs.setdefault("backend", vllm_backend)
        return await servers.start(create_app(config or ServerConfig(), **app_kwargs))

    yield make
    await servers.stop()


@pytest.fixture(scope="session")
async def server_url(serve) -> str:
    return await serve()
