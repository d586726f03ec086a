"""The page's side of the API keys: a login that keeps the key in a cookie.

A browser cannot send ``Authorization: Bearer`` on a page load, so the login
form (or ``/ui/login?key=KEY`` once, for a link) checks the key and sets it as
an HttpOnly, SameSite=Strict cookie (``Secure`` over https). The pages and the
API (``serving.dependencies.check_key``) accept that cookie; page scripts
cannot read it and other sites cannot make a browser send it. Without keys
configured everything is open, as the API is.

Example:
    >>> response = login_response(settings, request, "KEY", next_url="/ui/runs")
    >>> response.status_code
    303
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse

from refinery.engine.errors import AuthenticationError
from refinery.serving.dependencies import KEY_COOKIE, check_key, key_accepted
from refinery.ui.settings import UISettings

HOME = "/ui"


def ui_settings(request: Request) -> UISettings:
    """The page's settings (set by ``mount_ui``)."""
    return request.app.state.ui


async def require_key(request: Request) -> None:
    """Refuse a page or page API request without a known key (header or cookie).

    Raises:
        AuthenticationError: keys are configured and the request carries none of them;
            a page answers it with the login form (401).
    """
    check_key(request, ui_settings(request).api_keys)


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
    """A redirect to ``next_url`` that sets the key cookie.

    Raises:
        AuthenticationError: ``key`` is not one of the server's keys.
    """
    if settings.api_keys and not key_accepted(key, settings.api_keys):
        raise AuthenticationError("wrong API key", code="invalid_api_key")
    response = RedirectResponse(safe_next(next_url), status_code=303)
    if settings.api_keys:
        response.set_cookie(KEY_COOKIE, key, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
    return response


def logout_response() -> RedirectResponse:
    """A redirect to the login form that drops the key cookie."""
    response = RedirectResponse(f"{HOME}/login", status_code=303)
    response.delete_cookie(KEY_COOKIE, path="/", httponly=True, samesite="strict")
    return response
