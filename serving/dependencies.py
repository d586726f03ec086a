"""FastAPI dependencies of the routes: the server state, auth and capacity.

A request is authenticated by ``Authorization: Bearer KEY``, or by the web
page's login session: a random token in an HttpOnly, SameSite=Strict cookie,
mapped here (:class:`Sessions`) to the identity of the key it was opened with,
never the key itself, and to the client that opened it (on loopback, the local
user: a copy of the cookie replayed by another user's program opens nothing).
The API accepts the session only on requests the page's own scripts make
(``Sec-Fetch-Site: same-origin``, or a matching ``Origin``). Every key a
request sends, by bearer header or the login form, meets the client's
:class:`~refinery.serving.throttle.KeyThrottle` first.

Example:
    >>> @router.post("/v1/chat/completions", dependencies=[Depends(authorize)])  # doctest: +SKIP
    ... async def chat(req: ChatCompletionRequest, _: None = Depends(admit)): ...
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any

from fastapi import Depends, Request

from refinery.engine.errors import AuthenticationError
from refinery.serving.clients import ClientId, client_id
from refinery.serving.middleware import is_same_origin
from refinery.serving.state import ServerState
from refinery.serving.throttle import key_throttle

SESSION_COOKIE = "refinery_session"  # + "_<port>": one server's cookie is not another's
SESSION_SECONDS = 12 * 3600
SESSION_IDLE_SECONDS = 3600  # a session unused this long is over
MAX_SESSIONS = 1024


def server_state(request: Request) -> ServerState:
    """The app's :class:`ServerState` (set by ``create_app``)."""
    return request.app.state.server


State = Annotated[ServerState, Depends(server_state)]


# ----------------------------------------------------------------------------- sessions


def key_identity(key: str) -> str:
    """What a session records of its key: a digest, from which the key cannot be read."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Session:
    """One login: whose key opened it, from which client, and until when it holds
    (monotonic seconds: ``expires`` whatever happens, ``idle_until`` unless used)."""

    key_id: str
    owner: ClientId
    expires: float
    idle_until: float


class Sessions:
    """The page's logins: random tokens, each mapped to the identity of the key that
    opened it and the client that opened it, for ``ttl`` seconds, or ``idle``
    seconds unused, or until closed (logout). Tokens are kept hashed.

    At most ``limit`` are open; opening one more drops the oldest. A session whose
    key is no longer one of the server's keys opens nothing; nor does its token
    sent by another client than the one that opened it.
    """

    def __init__(self, ttl: float = SESSION_SECONDS, limit: int = MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic,
                 idle: float = SESSION_IDLE_SECONDS):
        self.ttl, self.limit, self.clock, self.idle = ttl, limit, clock, idle
        self._open: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, key: str, owner: ClientId) -> str:
        """A new session of ``key`` for ``owner``: its token (the cookie's value)."""
        token = secrets.token_urlsafe(32)
        now = self.clock()
        with self._lock:
            self._drop_expired()
            while len(self._open) >= self.limit:
                self._open.pop(next(iter(self._open)))
            self._open[_digest(token)] = Session(key_identity(key), owner, now + self.ttl,
                                                 now + self.idle)
        return token

    def key_id(self, token: str | None, owner: ClientId) -> str | None:
        """The key identity of an open, unexpired session ``token`` that ``owner``
        opened (else None); using it keeps it from idling out."""
        if not token:
            return None
        now, digest = self.clock(), _digest(token)
        with self._lock:
            session = self._open.get(digest)
            if session is None or min(session.expires, session.idle_until) <= now:
                return None
            if session.owner != owner:
                return None
            self._open[digest] = replace(session, idle_until=now + self.idle)
        return session.key_id

    def close(self, token: str | None) -> None:
        """End the session ``token`` (logout); an unknown token is nothing to end."""
        if token:
            with self._lock:
                self._open.pop(_digest(token), None)

    def __len__(self) -> int:
        return len(self._open)

    def _drop_expired(self) -> None:
        now = self.clock()
        for digest in [d for d, s in self._open.items() if min(s.expires, s.idle_until) <= now]:
            del self._open[digest]


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def sessions_of(app: Any) -> Sessions:
    """The app's :class:`Sessions` (made on first use: the API and the page share it)."""
    store = getattr(app.state, "sessions", None)
    if store is None:
        store = app.state.sessions = Sessions()
    return store


def session_cookie(request: Request) -> str:
    """The session cookie's name on this server: suffixed with the port it listens on,
    since browsers send a host's cookies to all of its ports."""
    server = request.scope.get("server")
    port = server[1] if server and len(server) > 1 and server[1] else None
    return f"{SESSION_COOKIE}_{port}" if port else SESSION_COOKIE


# --------------------------------------------------------------------------------- keys


def bearer_key(request: Request) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header, if any."""
    header = request.headers.get("authorization", "")
    return header[7:] if header.lower().startswith("bearer ") else None


def key_accepted(token: str, keys: frozenset[str]) -> bool:
    """Whether ``token`` is one of ``keys``, compared in constant time against each."""
    ok = False
    raw = token.encode("utf-8", "surrogatepass")
    for key in keys:  # every key, without early exit
        ok |= hmac.compare_digest(raw, key.encode("utf-8", "surrogatepass"))
    return ok


def session_key_id(request: Request) -> str | None:
    """The key identity of the request's session, if its cookie names an open session
    of this client (else None)."""
    token = request.cookies.get(session_cookie(request))
    return sessions_of(request.app).key_id(token, client_id(request.scope))


def session_accepted(request: Request, keys: frozenset[str]) -> bool:
    """Whether the request's session cookie is open and its key still one of ``keys``."""
    key_id = session_key_id(request)
    return key_id is not None and key_id in {key_identity(k) for k in keys}


def check_guess(request: Request, key: str, keys: frozenset[str],
                wrong: str = "invalid or missing API key") -> None:
    """Refuse ``key`` unless it is one of ``keys`` and its client is not locked out; a
    wrong one is counted against the client (:class:`~refinery.serving.throttle.KeyThrottle`).

    Raises:
        TooManyWrongKeysError: the client sent too many wrong keys lately (``key``
            is not read, right or wrong).
        AuthenticationError: ``key`` is not one of ``keys`` (saying ``wrong``).
    """
    throttle, client = key_throttle(request.app), client_id(request.scope)
    throttle.check(client)
    if not key_accepted(key, keys):
        throttle.failed(client)
        raise AuthenticationError(wrong, code="invalid_api_key")


def check_key(request: Request, keys: frozenset[str], *, session_ok: bool) -> None:
    """Refuse a request that carries none of ``keys`` (no keys configured: open).

    ``session_ok`` says whether this request may use the page's login session
    instead of a bearer key. A bearer key decides alone (:func:`check_guess`).

    Raises:
        TooManyWrongKeysError: a bearer key from a client locked out for wrong keys.
        AuthenticationError: a wrong bearer key, or none and no usable session.
    """
    if not keys:
        return
    bearer = bearer_key(request)
    if bearer is not None:
        return check_guess(request, bearer, keys)
    if session_ok and session_accepted(request, keys):
        return
    raise AuthenticationError("invalid or missing API key", code="invalid_api_key")


async def authorize(request: Request, state: State) -> None:
    """Refuse a request without one of the server's API keys (none configured: open).

    Raises:
        AuthenticationError: no ``Authorization: Bearer KEY`` header with a known key,
            nor the web page's session on a request of the page's own scripts.
    """
    check_key(request, state.config.api_keys, session_ok=is_same_origin(request.headers))


def caller_scope(request: Request, state: State) -> str:
    """Whose stored responses and conversations a request sees: the identity of the
    key it was let in with (its bearer key, or its session's), ``""`` on a server
    without keys. A route that uses it also depends on :func:`authorize`."""
    keys = state.config.api_keys
    if not keys:
        return ""
    bearer = bearer_key(request)
    if bearer is not None and key_accepted(bearer, keys):
        return key_identity(bearer)
    return session_key_id(request) or ""


Scope = Annotated[str, Depends(caller_scope)]


async def admit(state: State) -> AsyncIterator[None]:
    """Hold a capacity slot for the whole request, a stream until its last event.

    FastAPI runs the code after ``yield`` once the response has been sent, so a
    streamed response keeps its slot until its stream ends or the client leaves.

    Raises:
        OverCapacityError: the server is at ``max_concurrent_requests``.
    """
    with state.capacity.slot():
        yield
