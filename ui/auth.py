"""The page's side of the API keys: a login form that opens a session.

A browser cannot send ``Authorization: Bearer`` on a page load, so the login
form POSTs a key, which is checked (constant time; wrong keys throttled per
client, a right key never refused) and answered with a session cookie: a random
token mapped to the key's identity (``serving.dependencies.Sessions``), never the
key, HttpOnly, SameSite=Strict, expiring, ended by logout. Pages accept it on
navigation; the page's JSON API and ``/v1`` only on the page's own same-origin
requests. A key in the address (``/ui/login?key=``) is never used: addresses end
up in logs and history. Without keys configured everything is open, as the API is.

Example:
    >>> response = login_response(settings, request, "KEY", next_url="/ui/runs")
    >>> response.status_code
    303
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import RedirectResponse

from refinery.engine.errors import AuthenticationError, OverCapacityError
from refinery.serving.dependencies import (
    check_key,
    key_accepted,
    session_cookie,
    sessions_of,
)
from refinery.serving.middleware import is_same_origin
from refinery.ui.settings import UISettings

HOME = "/ui"
LOGIN_FAILURES = 5  # wrong keys per client per window, then refused until the window moves
LOGIN_WINDOW_SECONDS = 60.0


class TooManyLoginsError(OverCapacityError):
    """A client that sent too many wrong keys lately; ``retry_after`` seconds to wait."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message, code="too_many_logins")
        self.retry_after = retry_after


class LoginThrottle:
    """At most ``failures`` wrong keys per client address in any ``window`` seconds.

    It counts and refuses wrong keys only (``login_response`` checks the key first):
    a client address is shared (every local program is 127.0.0.1), so holding back a
    right key would let any of them lock the user out.
    """

    def __init__(self, failures: int = LOGIN_FAILURES, window: float = LOGIN_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic, max_clients: int = 4096):
        self.failures, self.window, self.clock = failures, window, clock
        self.max_clients = max_clients
        self._seen: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, client: str) -> None:
        """Raises:
            TooManyLoginsError: ``client`` is at its limit of wrong keys.
        """
        with self._lock:
            times = self._recent(client)
            if len(times) >= self.failures:
                wait = max(1, int(times[0] + self.window - self.clock()) + 1)
                raise TooManyLoginsError(f"too many wrong keys from this address; try again "
                                         f"in {wait} s", retry_after=wait)

    def failed(self, client: str) -> None:
        """Count one wrong key from ``client``."""
        with self._lock:
            if client not in self._seen and len(self._seen) >= self.max_clients:
                self._seen.pop(next(iter(self._seen)))
            self._seen.setdefault(client, deque()).append(self.clock())

    def _recent(self, client: str) -> deque[float]:
        times = self._seen.get(client, deque())
        while times and times[0] <= self.clock() - self.window:
            times.popleft()
        return times


def ui_settings(request: Request) -> UISettings:
    """The page's settings (set by ``mount_ui``)."""
    return request.app.state.ui


def login_throttle(request: Request) -> LoginThrottle:
    """The app's :class:`LoginThrottle` (made on first use)."""
    throttle = getattr(request.app.state, "login_throttle", None)
    if throttle is None:
        throttle = request.app.state.login_throttle = LoginThrottle()
    return throttle


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


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path of this page, never another site."""
    if not target:
        return HOME
    parts = urlsplit(target)
    path_ok = parts.path == HOME or parts.path.startswith(HOME + "/")
    if parts.scheme or parts.netloc or not path_ok or "\\" in target:
        return HOME
    return target


def client_of(request: Request) -> str:
    return request.client.host if request.client else "?"


def login_response(settings: UISettings, request: Request, key: str,
                   next_url: str | None) -> RedirectResponse:
    """A redirect to ``next_url`` that opens a session and sets its cookie.

    The key is checked first (constant time): a right key always opens a session,
    however many wrong ones came from the same address.

    Raises:
        TooManyLoginsError: ``key`` is wrong, and this client sent too many wrong keys
            lately.
        AuthenticationError: ``key`` is not one of the server's keys.
    """
    response = RedirectResponse(safe_next(next_url), status_code=303)
    if not settings.api_keys:
        return response
    if not key_accepted(key, settings.api_keys):
        # Only a wrong key meets the throttle: on loopback every local program shares
        # the user's address, and one flooding wrong keys must not lock the user out.
        throttle, client = login_throttle(request), client_of(request)
        throttle.check(client)
        throttle.failed(client)
        raise AuthenticationError("wrong API key", code="invalid_api_key")
    store = sessions_of(request.app)
    response.set_cookie(session_cookie(request), store.open(key), max_age=int(store.ttl),
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
