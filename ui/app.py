"""The web page, mounted on the API server or served alone over a runs directory.

``mount_ui(app)`` adds ``/ui`` to a ``refinery serve`` app (same process, same
keys and login sessions, the playground calls the app's own streaming chat endpoint);
``create_ui_app(settings)`` is ``refinery ui --runs DIR``: runs and traces
from disk, no engine. Errors on a page are pages (a 401 is the login form);
errors elsewhere keep the API's OpenAI error body.

Example:
    >>> app = create_app(ServerConfig(), backend_factory=factory)  # doctest: +SKIP
    >>> mount_ui(app, runs="runs")  # doctest: +SKIP
    >>> ui_only = create_ui_app(UISettings(runs=Path("runs")))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from refinery.engine.errors import RefineryError
from refinery.serving import errors as api_errors
from refinery.serving.app import redact_access_log
from refinery.serving.config import ServerConfig
from refinery.serving.dependencies import Sessions
from refinery.serving.middleware import SecurityHeaders, guard
from refinery.ui.auth import HOME
from refinery.ui.drawing import DRAWER
from refinery.ui.pages import HEADERS, STATIC, render
from refinery.ui.routes import router
from refinery.ui.settings import UISettings

API_PREFIXES = (f"{HOME}/api/", f"{HOME}/static/")


def mount_ui(app: FastAPI, runs: str | Path | None = None) -> FastAPI:
    """Add the page to a server app made by ``serving.create_app`` (its config's keys)."""
    config: ServerConfig = app.state.server.config
    return install(app, UISettings.of_server(config, runs))


def create_ui_app(settings: UISettings, max_body_bytes: int = 4 * 1024 * 1024) -> FastAPI:
    """The page alone, over ``settings.runs`` (``refinery ui``): no engine, no API."""
    app = FastAPI(title="refinery ui", version="0.1.0", openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.state.sessions = Sessions()
    api_errors.register_error_handlers(app)
    guard(app, max_body_bytes=max_body_bytes, allowed_hosts=settings.allowed_hosts)
    redact_access_log()

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(f"{HOME}/runs")

    return install(app, settings, headers_on="")


def install(app: FastAPI, settings: UISettings, headers_on: str = HOME) -> FastAPI:
    """The page's routes, static files and error pages on ``app``; every response under
    ``headers_on`` (static files and redirects too) carries the page's security headers:
    the whole app of ``refinery ui``, ``/ui`` of ``refinery serve``."""
    app.state.ui = settings
    app.add_middleware(SecurityHeaders, headers=HEADERS, prefix=headers_on)
    app.include_router(router)
    app.mount(f"{HOME}/static", StaticFiles(directory=STATIC), name="ui-static")
    for kind in (RefineryError, RequestValidationError, StarletteHTTPException):
        app.add_exception_handler(kind, handle)
    with_lifespan(app, DRAWER.warm if settings.draw_in_process else None, DRAWER.close)
    return app


def with_lifespan(app: FastAPI, start: Callable[[], None] | None,
                  close: Callable[[], None]) -> None:
    """Call ``start`` (if any) when ``app`` starts and ``close`` when it shuts down,
    around the lifespan it already has (the engine's, under ``refinery serve``):
    wrapped, since a lifespan replaces the handlers an app would otherwise run."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        if start is not None:
            start()
        try:
            async with inner(app_) as state:
                yield state
        finally:
            close()

    app.router.lifespan_context = lifespan


def is_page(request: Request) -> bool:
    """Whether a request is for a page (an HTML answer), not the API or a static file."""
    path = request.url.path
    return (path == HOME or path.startswith(HOME + "/")) and not path.startswith(API_PREFIXES)


async def handle(request: Request, exc: Exception) -> Response:
    """A failed page as a page (the login form on a 401); anything else as the API does."""
    if not is_page(request):
        return await api_errors.handle(request, exc)
    status, body = api_errors.openai_error(exc)
    template = "login.html" if status == 401 else "error.html"
    return render(request, template, status=status, page="error", error=body.error,
                  message=body.error.message, next=return_to(request))


def return_to(request: Request) -> str:
    """Where a login from this failed page should lead: the page itself, minus any key."""
    if request.url.path == f"{HOME}/login":
        return request.query_params.get("next") or HOME
    query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "key"])
    return request.url.path + (f"?{query}" if query else "")
