"""Use no CPU at all and never finish (only the wall clock can end it)."""
import time


def attack():
    time.sleep(10**6)
    return "escaped"
