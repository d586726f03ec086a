"""ASGI middleware of the server: what every request must pass and every response carries.

Before any route runs: the body size limit (:class:`BodyLimit`), then
:class:`RequestChecks` (a loopback connection's ``Host`` is a loopback name, a
state-changing request is not sent by another origin, a ``/v1`` body is JSON).
Every response: the security headers (:class:`SecurityHeaders`), and redirects
as paths of this server, never built from the ``Host`` header
(:class:`RelativeRedirects`). :func:`guard` installs them all.

A refusal is a typed error of the exception hierarchy, answered by
``errors.error_response`` as the OpenAI error body.

Example:
    >>> guard(app, max_body_bytes=4 * 1024 * 1024, allowed_hosts=frozenset())  # doctest: +SKIP
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from refinery.engine.errors import InvalidRequestError, RefineryError, RequestTooLargeError
from refinery.serving.clients import is_loopback
from refinery.serving.errors import error_response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Sec-Fetch-Site values of a request this server's own pages (or the user) made.
OWN_SITES = frozenset({"same-origin", "none"})
BASE_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


class UntrustedHostError(InvalidRequestError):
    """A request on a loopback address whose ``Host`` is not a loopback name (nor allowed)."""


class CrossOriginError(RefineryError):
    """A state-changing request another origin made a browser send (CSRF)."""

    status = 403
    type = "permission_error"


class UnsupportedMediaTypeError(InvalidRequestError):
    """A ``/v1`` request body that is not declared as JSON."""

    status = 415


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a 413.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body (no length) is counted as it arrives and refused once over,
    so an endless upload cannot fill memory.

    Example:
        >>> app.add_middleware(BodyLimit, limit=4 * 1024 * 1024)  # doctest: +SKIP
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            response = error_response(RequestTooLargeError(
                f"request body of {int(length)} bytes is over the limit of {self.limit}"))
            return await response(scope, receive, send)
        await self.app(scope, self.counted(receive), send)

    def counted(self, receive: Receive) -> Receive:
        """``receive``, refusing the body once more than ``limit`` bytes arrived."""
        seen = 0

        async def receive_counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Raised inside the route's body read: FastAPI re-raises an
                    # HTTPException as is (any other error would become a 400), and
                    # the error handlers answer it as the OpenAI 413 body.
                    raise StarletteHTTPException(413, f"request body is over the limit of "
                                                      f"{self.limit} bytes")
            return message

        return receive_counted


# ------------------------------------------------------------------------ request checks


# RFC 3986's host [":" port]: an IPv6 literal in brackets, or a name of letters, digits,
# dots, hyphens and underscores (IPv4 literals included); nothing after the port.
HOST = re.compile(r"(?:\[(?P<literal>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::[0-9]{0,5})?")


def host_name(host: str) -> str | None:
    """The name of a ``Host`` header value, lowercased, without port or IPv6 brackets;
    None when it is not ``host[:port]`` as RFC 3986 writes them (``[::1]x``, ``h:80@x``).

    >>> host_name("LocalHost:8000"), host_name("[::1]:80"), host_name("[::1]evil.example")
    ('localhost', '::1', None)
    """
    match = HOST.fullmatch(host.strip().lower())
    if match is None:
        return None
    literal = match["literal"]
    if literal is None:
        return match["name"]
    try:
        return str(ipaddress.IPv6Address(literal))
    except ValueError:
        return None


def check_host(scope: Scope, allowed: frozenset[str]) -> None:
    """Refuse a request that reached a loopback address under a name that is not one.

    Raises:
        UntrustedHostError: the ``Host`` is neither a loopback name nor in ``allowed``.
    """
    server = scope.get("server")
    if "*" in allowed or not server or not is_loopback(str(server[0])):
        return
    raw = Headers(scope=scope).get("host", "")
    name = host_name(raw)
    if name is None:
        raise UntrustedHostError(f"Host {raw[:100]!r} is not a host name (RFC 3986)",
                                 code="untrusted_host")
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or name in allowed:
        return
    raise UntrustedHostError(f"Host {name!r} is not a name of this server (it listens on a "
                             "loopback address); add it with --allowed-hosts (or "
                             "REFINERY_ALLOWED_HOSTS) if it is",
                             code="untrusted_host")


def same_netloc(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header names the host and port of a ``Host`` header."""
    parts = urlsplit(origin)
    default = {"http": "80", "https": "443"}.get(parts.scheme, "")
    netloc = parts.netloc.lower().removesuffix(f":{default}")
    return bool(netloc) and netloc == host.strip().lower().removesuffix(f":{default}")


def is_same_origin(headers: Headers) -> bool:
    """Whether a browser says this request comes from this server's own pages:
    ``Sec-Fetch-Site: same-origin``, or (older browsers) an ``Origin`` equal to the host.
    A client that sends neither (curl, an SDK) is not a page of this server."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = headers.get("origin")
    return origin is not None and same_netloc(origin, headers.get("host", ""))


def check_origin(scope: Scope) -> None:
    """Refuse a state-changing request a browser sent from another origin.

    Another local port is another origin but the same site, so SameSite cookies do
    not stop it; ``Sec-Fetch-Site`` and ``Origin`` do. ``Sec-Fetch-Site`` decides
    when the browser sends it: under ``Referrer-Policy: no-referrer`` a browser
    sends ``Origin: null`` even on a page's own form posts. Without it (an older
    browser), ``Origin`` decides. A request with neither (not from a browser)
    passes: only a browser can be made to send one unawares.

    Raises:
        CrossOriginError: ``Sec-Fetch-Site`` is cross-site or same-site, or (without
            it) ``Origin`` names another host, port or an opaque origin (``null``).
    """
    if scope["method"] in SAFE_METHODS:
        return
    headers = Headers(scope=scope)
    site, origin = headers.get("sec-fetch-site"), headers.get("origin")
    if site is not None:
        if site not in OWN_SITES:
            raise CrossOriginError(f"refused: a {site} request may not change anything "
                                   "here", code="cross_origin")
        return
    if origin is not None and not same_netloc(origin, headers.get("host", "")):
        raise CrossOriginError(f"refused: a request from {origin[:100]!r} may not change "
                               "anything here", code="cross_origin")


def check_json_body(scope: Scope) -> None:
    """Refuse a ``/v1`` request body that is not declared as JSON (a form or text/plain
    body is what another site can post without a CORS preflight).

    Raises:
        UnsupportedMediaTypeError: a POST, PUT or PATCH under ``/v1/`` whose
            ``Content-Type`` is not ``application/json`` (or ``*/*+json``).
    """
    if scope["method"] not in BODY_METHODS or not scope["path"].startswith("/v1/"):
        return
    kind = Headers(scope=scope).get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json" or (kind.startswith("application/") and
                                      kind.endswith("+json")):
        return
    raise UnsupportedMediaTypeError(
        f"the body must be JSON (Content-Type: application/json), not {kind or 'undeclared'}",
        code="unsupported_media_type")


class RequestChecks:
    """Run :func:`check_host`, :func:`check_origin` and :func:`check_json_body` on each
    HTTP request; a refusal is answered as the OpenAI error body, the route never runs."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] = frozenset()):
        self.app = app
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                check_host(scope, self.allowed_hosts)
                check_origin(scope)
                check_json_body(scope)
            except RefineryError as exc:
                return await error_response(exc)(scope, receive, send)
        await self.app(scope, receive, send)


# ------------------------------------------------------------------------ response headers


class SecurityHeaders:
    """Add ``headers`` to every response under ``prefix`` that does not set them itself,
    the 500 of an unexpected error included: it is answered here (the OpenAI error
    body), before Starlette's outermost error middleware would answer it bare, and the
    error goes on up to be logged."""

    def __init__(self, app: ASGIApp, headers: Mapping[str, str] = BASE_HEADERS,
                 prefix: str = ""):
        self.app = app
        self.headers = dict(headers)
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            return await self.app(scope, receive, send)

        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers.setdefault(name, value)
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        except Exception as exc:
            if not started:
                await error_response(exc)(scope, receive, send_with_headers)
            raise


def relative_location(location: str, host: str) -> str:
    """``location`` as a path when it points at ``host`` (as Starlette's slash redirects
    build it from the ``Host`` header); other locations unchanged."""
    parts = urlsplit(location)
    if not parts.netloc or parts.netloc.lower() != host.strip().lower():
        return location
    path = "/" + parts.path.lstrip("/")  # never "//x": that would name another host
    return path + (f"?{parts.query}" if parts.query else "")


class RelativeRedirects:
    """Send every redirect to a path of this server, never to the ``Host`` it was asked
    under (so a forged ``Host`` cannot turn a redirect into one to another site)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = Headers(scope=scope).get("host", "")

        async def send_relative(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "location" in headers:
                    headers["location"] = relative_location(headers["location"], host)
            await send(message)

        await self.app(scope, receive, send_relative)


def guard(app: Any, *, max_body_bytes: int, allowed_hosts: frozenset[str]) -> None:
    """Install the request checks and response headers on a FastAPI ``app``."""
    app.add_middleware(RequestChecks, allowed_hosts=allowed_hosts)
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(RelativeRedirects)
    app.add_middleware(SecurityHeaders)
