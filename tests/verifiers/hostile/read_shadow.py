"""Read the host's password hashes."""


def attack():
    with open("/etc/shadow") as f:
        assert f.read()
    return "escaped"
