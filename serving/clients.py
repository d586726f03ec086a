"""Who a request comes from, as far as the server can tell: what throttles and sessions
are keyed by.

A remote client is its address. On loopback every local program has the same
address (and any of 127.0.0.0/8), so there the client is the local user that
owns the connecting socket, read from the kernel's socket table
(``/proc/net/tcp``, ``tcp6``): the browser of the user who logged in is that
user, another user's program on the same machine is not, whichever port or
loopback address it uses. Where the owner cannot be read (no ``/proc``), every
loopback client is one.

``X-Forwarded-For`` is trusted only from the addresses the operator lists
(:func:`uvicorn_proxy_options`): uvicorn by default believes it from 127.0.0.1,
which is every local program.

Example:
    >>> ClientId.of(("203.0.113.9", 51000), ("0.0.0.0", 8000))
    ClientId(address='203.0.113.9', user=None)
    >>> uvicorn_proxy_options(frozenset())
    {'proxy_headers': False, 'forwarded_allow_ips': None}
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK = "loopback"
SOCKET_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class ClientId:
    """A client: its address (``loopback`` for any loopback one) and, on loopback, the
    uid of the local user whose socket it is (None: not known)."""

    address: str
    user: int | None = None

    @classmethod
    def of(cls, client: Any, server: Any) -> ClientId:
        """The client of a connection from ``client`` to ``server`` (ASGI ``(host, port)``
        pairs, either may be missing)."""
        if not client:
            return cls("?")
        host = str(client[0])
        if not is_loopback(host):
            return cls(host)
        port = client[1] if len(client) > 1 else None
        user = socket_owner((host, port), (str(server[0]), server[1])) if server else None
        return cls(LOOPBACK, user)

    def __str__(self) -> str:
        return self.address if self.user is None else f"{self.address} (uid {self.user})"


def client_id(scope: Any) -> ClientId:
    """The :class:`ClientId` of an ASGI connection ``scope`` (or a request's)."""
    return ClientId.of(scope.get("client"), scope.get("server"))


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP literal) is a loopback address (127/8, ::1, and
    127/8 mapped into IPv6)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def socket_owner(local: tuple[str, Any], remote: tuple[str, Any]) -> int | None:
    """The uid owning the TCP socket from ``local`` to ``remote`` on this machine (the
    client's end of a loopback connection), or None when no table lists it."""
    want = (_hex_endpoint(*local), _hex_endpoint(*remote))
    if None in want:
        return None
    for table in SOCKET_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 7 and (fields[1], fields[2]) == want:
                return int(fields[7])
    return None


def _hex_endpoint(host: str, port: Any) -> str | None:
    """An address and port as ``/proc/net/tcp`` writes them: the address's bytes in the
    host's order, 32 bits at a time, in hex; ``tcp6`` for an IPv6 one."""
    if not isinstance(port, int):
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    raw = ip.packed
    words = [int.from_bytes(raw[i:i + 4], "big") for i in range(0, len(raw), 4)]
    hexed = "".join(f"{socket.htonl(w):08X}" for w in words)
    return f"{hexed}:{port:04X}"


def uvicorn_proxy_options(forwarded_allow_ips: frozenset[str]) -> dict[str, Any]:
    """The uvicorn options that make it believe ``X-Forwarded-For`` / ``-Proto`` only
    from ``forwarded_allow_ips`` (none: from nobody, which uvicorn's defaults, trusting
    127.0.0.1, are not). ``uvicorn.Config(app, **uvicorn_proxy_options(ips))``."""
    if not forwarded_allow_ips:
        return {"proxy_headers": False, "forwarded_allow_ips": None}
    return {"proxy_headers": True, "forwarded_allow_ips": ",".join(sorted(forwarded_allow_ips))}
