"""Open file descriptors until refused."""
import os


def attack():
    fds = []
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
        assert len(fds) < 100000
