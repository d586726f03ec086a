"""Who a request comes from, as far as the server can tell: what throttles and sessions
are keyed by.

A remote client is its address. On loopback every local program has the same
address (and any of 127.0.0.0/8), so there the client is the local user that
owns the connecting socket, asked of the kernel (``sock_diag``, as ``ss``
does): the browser of the user who logged in is that
user, another user's program on the same machine is not, whichever port or
loopback address it uses. Where the owner cannot be read (no netlink), every
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
import struct
from dataclasses import dataclass
from typing import Any

LOOPBACK = "loopback"


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
    client's end of a loopback connection), or None when the kernel lists none.

    Asked of the kernel's socket diagnostics (netlink ``sock_diag``, what ``ss``
    uses) for that one socket: a lookup, not a read of ``/proc/net/tcp``, which
    takes tens of milliseconds on a busy machine.
    """
    try:
        ip = ipaddress.ip_address(local[0])
        peer = ipaddress.ip_address(remote[0])
    except ValueError:
        return None
    if not isinstance(local[1], int) or not isinstance(remote[1], int):
        return None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    request = _diag_request(family, ip.packed, local[1], peer.packed, remote[1])
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(request, (0, 0))
            reply = nl.recv(8192)
    except OSError:
        return None
    if len(reply) < UID_OFFSET + 4:
        return None
    kind = struct.unpack_from("=H", reply, 4)[0]
    return struct.unpack_from("=I", reply, UID_OFFSET)[0] if kind == SOCK_DIAG_BY_FAMILY else None


NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST = 4, 20, 1
UID_OFFSET = 16 + 4 + 48 + 12  # nlmsghdr, then inet_diag_msg's head, sockid, 3 counters


def _diag_request(family: int, src: bytes, sport: int, dst: bytes, dport: int) -> bytes:
    """A netlink ``inet_diag_req_v2`` asking for the one TCP socket ``src:sport ->
    dst:dport`` (any state, no cookie)."""
    sockid = (struct.pack("!HH", sport, dport) + src.ljust(16, b"\0") + dst.ljust(16, b"\0")
              + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF))
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    return struct.pack("=IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body


def uvicorn_proxy_options(forwarded_allow_ips: frozenset[str]) -> dict[str, Any]:
    """The uvicorn options that make it believe ``X-Forwarded-For`` / ``-Proto`` only
    from ``forwarded_allow_ips`` (none: from nobody, which uvicorn's defaults, trusting
    127.0.0.1, are not). ``uvicorn.Config(app, **uvicorn_proxy_options(ips))``."""
    if not forwarded_allow_ips:
        return {"proxy_headers": False, "forwarded_allow_ips": None}
    return {"proxy_headers": True, "forwarded_allow_ips": ",".join(sorted(forwarded_allow_ips))}
