"""``refinery check``: run a verifier from the shell and print its Verdict as JSON.

Exit status 0 whether the answer passed or not (read ``passed`` in the JSON),
2 on bad usage (a missing file, a missing option), 1 when the check itself
could not run (no sandbox here).

Example:
    $ refinery check math '\\boxed{\\frac{1}{2}}' 0.5
    {"passed":true,"score":1.0,"detail":{...}}
    $ refinery check code solution.py --tests tests.py --entry-point add
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from refinery.engine.console import fail
from refinery.engine.errors import RefineryError
from refinery.engine.types import Task
from refinery.verifiers.base import Verdict

check_app = typer.Typer(
    name="check",
    help="Check an answer with a verifier; prints the Verdict as JSON (exit 0 pass or fail).",
    no_args_is_help=True,
    add_completion=False,
)


def _emit(verdict: Verdict) -> None:
    typer.echo(verdict.model_dump_json())


@check_app.command("math")
def check_math(
    prediction: str = typer.Argument(..., help="The model's answer or whole solution."),
    gold: str = typer.Argument(..., help="The reference answer."),
    timeout: float = typer.Option(5.0, min=0.1, help="Seconds allowed for symbolic work."),
) -> None:
    """Is PREDICTION mathematically equivalent to GOLD? (extraction + math-verify)"""
    from refinery.verifiers.math import MathVerifier

    try:
        verdict = asyncio.run(MathVerifier(timeout=timeout).verify(
            Task.from_prompt("", id="cli"), prediction, gold))
    except RefineryError as e:
        fail(e)
    _emit(verdict)


@check_app.command("code")
def check_code(
    candidate: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                     help="Python file with the candidate code."),
    tests: Path = typer.Option(..., "--tests", exists=True, dir_okay=False, readable=True,
                               help="Python file with the tests (e.g. a `check(candidate)`)."),
    entry_point: str | None = typer.Option(
        None, "--entry-point", help="Function to test: appends `check(ENTRY_POINT)`."),
    timeout: float = typer.Option(10.0, min=0.1, help="Wall-clock seconds for the run."),
    allow_unsandboxed: bool = typer.Option(
        False, help="Run with rlimits only where bubblewrap is unavailable (unsafe)."),
) -> None:
    """Run CANDIDATE.py plus its tests in the sandbox."""
    from refinery.verifiers.code import CodeVerifier

    task = Task.from_prompt("", id="cli", metadata={
        "tests": tests.read_text(encoding="utf-8"), "entry_point": entry_point})
    try:
        verifier = CodeVerifier(wall_timeout=timeout, allow_unsandboxed=allow_unsandboxed)
        verdict = asyncio.run(verifier.verify(task, candidate.read_text(encoding="utf-8")))
    except RefineryError as e:
        fail(e)
    _emit(verdict)
