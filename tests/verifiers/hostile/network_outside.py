"""Reach the outside world: DNS and a public address."""
import socket


def attack():
    socket.getaddrinfo("pypi.org", 443)
    socket.create_connection(("1.1.1.1", 53), timeout=2).close()
    return "escaped"
