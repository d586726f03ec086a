"""Connect to a service the host runs on 127.0.0.1 and talk to it."""
import socket


def attack():
    with socket.create_connection(("127.0.0.1", int("{{PORT}}")), timeout=2) as s:
        s.sendall(b"pwned\n")
    return "escaped"
