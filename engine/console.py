"""How every ``refinery`` command reports an error: one red line, then an exit status.

Status 2 when the caller asked for something wrong (an ``InvalidRequestError``,
an unknown model: what the server answers with a 4xx), 1 when the work itself
failed (an engine that would not start, a backend error, no answer). Ctrl-C
exits 130, and so does SIGTERM once :func:`interrupt_on_sigterm` is installed.

Example:
    >>> try:
    ...     strategies.build(spec)
    ... except RefineryError as exc:
    ...     fail(exc)
"""

from __future__ import annotations

import signal
from typing import NoReturn

import typer
from pydantic import ValidationError

from refinery.engine.errors import RefineryError

USAGE, FAILURE, INTERRUPTED = 2, 1, 130


def exit_status(exc: BaseException) -> int:
    """2 for the caller's fault (a 4xx refinery error), 1 for anything else."""
    if isinstance(exc, RefineryError) and 400 <= exc.status < 500:
        return USAGE
    return FAILURE


def fail(error: BaseException | str, status: int | None = None) -> NoReturn:
    """Print ``error`` on stderr and exit with ``status`` (default: by its type)."""
    typer.secho(f"error: {error}", fg="red", err=True)
    if status is None:
        status = exit_status(error) if isinstance(error, BaseException) else FAILURE
    raise typer.Exit(status)


def bad_option(exc: ValidationError) -> NoReturn:
    """Exit 2 naming the first option a command's config model refused."""
    err = exc.errors()[0]
    fail(f"bad option {'.'.join(str(x) for x in err['loc'])}: {err['msg']}", USAGE)


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
    """
    signal.signal(signal.SIGTERM, _raise_interrupt)
