"""Spin on the CPU forever, ignoring SIGXCPU (the hard RLIMIT_CPU must SIGKILL it)."""
import signal


def attack():
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    n = 0
    while True:
        n += 1
