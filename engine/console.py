"""SIGTERM as Ctrl-C, for a program that owns an engine.

The ``refinery`` command line installs it, and so does every bench: see
:func:`interrupt_on_sigterm`. The command line's error lines and exit statuses
live with it, in ``refinery.cli.console``.
"""

from __future__ import annotations

import signal


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupt_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C, so ``finally`` blocks close the engine.

    SIGTERM's default kills Python without running ``finally``; vLLM's engine core
    runs in a child process that does not watch its parent, so it would be left
    running with its GBs of memory and its cores busy. As a ``KeyboardInterrupt``,
    ``asyncio.run`` cancels the tasks and ``await backend.aclose()`` stops the
    engine. Call it once, from the main thread of a program that owns an engine
    (every ``refinery`` command but ``serve``, which drains on SIGTERM itself;
    the benches).

    Example:
        >>> interrupt_on_sigterm()  # doctest: +SKIP
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
