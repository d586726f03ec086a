"""The page's side of the API keys: a login form that opens a session.

A browser cannot send ``Authorization: Bearer`` on a page load, so the login
form POSTs a key, which is checked (constant time; after a few wrong keys the
client is locked out for a while, right keys included: ``serving.throttle``) and
answered with a session cookie: a random token mapped to the key's identity and
the client (``serving.dependencies.Sessions``), never the key, HttpOnly,
SameSite=Strict, expiring (and sooner unused), ended by logout. Pages accept it on
navigation; the page's JSON API and ``/v1`` only on the page's own same-origin
requests. A key in the address (``/ui/login?key=``) is never used: addresses end
up in logs and history. Without keys configured everything is open, as the API is.

Example:
    >>> response = login_response(settings, request, "KEY", next_url="/ui/runs")  # doctest: +SKIP
    >>> response.status_code  # doctest: +SKIP
    303
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse

from refinery.serving.clients import client_id
from refinery.serving.dependencies import (
    check_guess,
    check_key,
    session_cookie,
    sessions_of,
)
from refinery.serving.middleware import CrossOriginError, is_same_origin
from refinery.ui.settings import UISettings

HOME = "/ui"
OTHER_SITES = frozenset({"cross-site", "same-site"})


def ui_settings(request: Request) -> UISettings:
    """The page's settings (set by ``mount_ui``)."""
    return request.app.state.ui


def is_navigation(request: Request) -> bool:
    """A page load (GET or HEAD of a page, not of the page's JSON API)."""
    return request.method in ("GET", "HEAD") and not request.url.path.startswith(f"{HOME}/api/")


async def require_key(request: Request) -> None:
    """Refuse a page or page API request without a known key (bearer header or session).

    The session counts on a page load, and otherwise only on the page's own
    same-origin requests.

    Raises:
        AuthenticationError: keys are configured and the request carries none of them;
            a page answers it with the login form (401).
    """
    session_ok = is_navigation(request) or is_same_origin(request.headers)
    check_key(request, ui_settings(request).api_keys, session_ok=session_ok)


async def refuse_other_sites(request: Request) -> None:
    """Refuse a page that reads run files or draws a trace when another site made the
    browser ask for it (``Sec-Fetch-Site: cross-site`` or ``same-site``: another local
    port is the same site). An ``<img>`` on another port's page would otherwise start
    drawings in the user's name; following a link from there is refused as well.

    Raises:
        CrossOriginError: the browser says another site asked (403).
    """
    site = request.headers.get("sec-fetch-site")
    if site in OTHER_SITES:
        raise CrossOriginError(f"refused: this page reads run files, and a {site} page "
                               "asked for it; open it from this server's own pages",
                               code="cross_origin")


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this page, never another site."""
    if not target:
        return HOME
    parts = urlsplit(target)
    path_ok = parts.path == HOME or parts.path.startswith(HOME + "/")
    if parts.scheme or parts.netloc or not path_ok or "\\" in target:
        return HOME
    return target


def login_response(settings: UISettings, request: Request, key: str,
                   next_url: str | None) -> RedirectResponse:
    """A redirect to ``next_url`` that opens a session of this client and sets its
    cookie.

    Raises:
        TooManyWrongKeysError: this client sent too many wrong keys lately (``key``
            is not read).
        AuthenticationError: ``key`` is not one of the server's keys.
    """
    response = RedirectResponse(safe_next(next_url), status_code=303)
    if not settings.api_keys:
        return response
    check_guess(request, key, settings.api_keys, wrong="wrong API key")
    store = sessions_of(request.app)
    token = store.open(key, client_id(request.scope))
    response.set_cookie(session_cookie(request), token, max_age=int(store.ttl),
                        httponly=True, samesite="strict", path="/",
                        secure=request.url.scheme == "https")
    return response


def logout_response(request: Request) -> RedirectResponse:
    """A redirect to the login form that ends the session and drops its cookie."""
    name = session_cookie(request)
    sessions_of(request.app).close(request.cookies.get(name))
    response = RedirectResponse(f"{HOME}/login", status_code=303)
    response.delete_cookie(name, path="/", httponly=True, samesite="strict")
    return response
