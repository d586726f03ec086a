"""The page's routes: thin, each one a page context rendered, or a redirect.

Every page and the page's JSON API are behind ``require_key`` (the server's API
keys, by bearer header or the login session); the login form and the static
files are not. Pages that read run files or draw a trace are refused to other
sites (``refuse_other_sites``) and drawn in a worker process (``draw_page``),
admitted by cost: never on the event loop. None is in the OpenAPI schema: the
schema documents the API.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from refinery.engine.errors import AuthenticationError
from refinery.serving.throttle import TooManyWrongKeysError
from refinery.ui.auth import (
    login_response,
    logout_response,
    refuse_other_sites,
    require_key,
    ui_settings,
)
from refinery.ui.drawing import PAGE_COST
from refinery.ui.pages import (
    draw_page,
    draw_posted_trace,
    draw_run,
    draw_run_trace,
    draw_runs,
    form_body,
    form_fields,
    render,
    run_trace_cost,
)
from refinery.ui.specs import SpecCheck, check_spec

router = APIRouter(prefix="/ui", include_in_schema=False)
PAGE = [Depends(require_key)]
# Pages that read run files or draw: never for another site (an <img> of another
# local port's page would start them in the user's browser).
RUN_PAGE = [Depends(refuse_other_sites), *PAGE]
KEY_IN_ADDRESS = ("A key in the address is not used: addresses are kept in logs and "
                  "browser history. Enter it here instead.")


@router.get("", dependencies=PAGE)
async def playground(request: Request) -> HTMLResponse:
    return render(request, "playground.html", page="playground")


@router.get("/runs", dependencies=RUN_PAGE)
async def runs(request: Request) -> HTMLResponse:
    return await draw_page(request, draw_runs)


@router.get("/run", dependencies=RUN_PAGE)
async def run(request: Request, path: str = Query(max_length=1000)) -> HTMLResponse:
    return await draw_page(request, draw_run, path)


@router.get("/trace", dependencies=RUN_PAGE)
async def trace(request: Request, run: str | None = Query(None, max_length=1000),
                task: str | None = Query(None, max_length=1000)) -> HTMLResponse:
    """A run's problem's trace; without both parameters, the form to paste one."""
    if run is None or task is None:
        return render(request, "trace_open.html", page="trace")
    cost = run_trace_cost(ui_settings(request), run)
    return await draw_page(request, draw_run_trace, run, task, cost=cost)


@router.post("/trace", dependencies=PAGE)
async def posted_trace(request: Request) -> HTMLResponse:
    body = await form_body(request)
    return await draw_page(request, draw_posted_trace, body, cost=PAGE_COST + len(body))


@router.get("/api/spec", dependencies=PAGE)
async def spec(request: Request, spec: str = Query(max_length=4000)) -> SpecCheck:
    """The spec checked as the server would run it (errors, did-you-mean, worst case)."""
    settings = ui_settings(request)
    return check_spec(spec, settings.max_spec_calls, settings.presets)


@router.get("/login")
async def login_form(request: Request, key: str | None = Query(None, max_length=4096),
                     next_url: str | None = Query(None, alias="next", max_length=2000),
                     ) -> Response:
    """The login form. A ``?key=`` is refused unread (400): the form POSTs keys."""
    if key is not None:
        return render(request, "login.html", status=400, page="login", next=next_url or "",
                      message=KEY_IN_ADDRESS)
    return render(request, "login.html", page="login", next=next_url or "", message=None)


@router.post("/login")
async def login(request: Request) -> Response:
    fields = await form_fields(request)
    next_url = fields.get("next", "")
    try:
        return login_response(ui_settings(request), request, fields.get("key", ""), next_url)
    except TooManyWrongKeysError as exc:
        return render(request, "login.html", status=exc.status, page="login", next=next_url,
                      message=exc.message, headers={"Retry-After": str(exc.retry_after)})
    except AuthenticationError as exc:
        return render(request, "login.html", status=401, page="login", next=next_url,
                      message=exc.message)


@router.post("/logout")
async def logout(request: Request) -> RedirectResponse:
    return logout_response(request)
