"""Waiting on a condition instead of sleeping for a fixed time.

A fixed sleep is either too short on a loaded machine (a flaky test) or too
long on a quiet one (a slow suite); polling a condition is neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def wait_for(predicate: Callable[[], object], seconds: float = 5.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``seconds`` pass (False)."""
    for _ in range(int(seconds / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return bool(predicate())
