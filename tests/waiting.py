"""Waiting on a condition instead of sleeping for a fixed time.

A fixed sleep is either too short on a loaded machine (a flaky test) or too
long on a quiet one (a slow suite); polling a condition is neither. The
``seconds`` bound only turns a hang into a failure: no test asserts on time.

``wait_for`` polls on the event loop (the servers under test share it);
``wait_until`` polls from a plain thread, for tests that drive subprocesses.

>>> wait_until(lambda: True)
True
>>> wait_until(lambda: False, seconds=0.05)
False
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable

EVERY = 0.01  # seconds between polls: short beside any engine step, cheap beside a test


async def wait_for(predicate: Callable[[], object], seconds: float = 5.0,
                   every: float = EVERY) -> bool:
    """Poll ``predicate`` until it holds (True) or ``seconds`` pass (False).

    ``predicate`` may be a coroutine function, e.g. a request to a server that
    runs on this event loop.
    """
    deadline = time.monotonic() + seconds
    while True:
        held = predicate()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every)


def wait_until(predicate: Callable[[], object], seconds: float = 5.0,
               every: float = EVERY) -> bool:
    """``wait_for`` off the event loop: poll ``predicate`` until it holds (True)
    or ``seconds`` pass (False), sleeping ``every`` seconds in between."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True
