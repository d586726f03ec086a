"""A real uvicorn server on 127.0.0.1, in the test session's event loop, over
the session's one real vLLM engine (so tests can inspect the engine's state)."""

from __future__ import annotations

import asyncio

import pytest
import uvicorn

from refinery.serving import ServerConfig, create_app
from tests.conftest import free_port


async def start_server(app) -> tuple[uvicorn.Server, asyncio.Task, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    return server, task, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
async def serve(vllm_backend):
    """A factory: ``url = await serve(ServerConfig(...))``; all stopped at session end."""
    running = []

    async def make(config: ServerConfig | None = None, **app_kwargs) -> str:
        if "backend_factory" not in app_kwargs:
            app_kwargs.setdefault("backend", vllm_backend)
        server, task, url = await start_server(create_app(config or ServerConfig(),
                                                          **app_kwargs))
        running.append((server, task))
        return url

    yield make
    for server, _ in running:
        server.should_exit = True
    await asyncio.gather(*(t for _, t in running), return_exceptions=True)


@pytest.fixture(scope="session")
async def server_url(serve) -> str:
    return await serve()
