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

from pathlib import Path

import click

from refinery.cli.console import fail, run_or_fail
from refinery.engine.errors import RefineryError
from refinery.engine.types import Task

__all__ = ["check_group"]

_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


@click.group("check")
def check_group() -> None:
    """Check an answer with a verifier; prints the Verdict as JSON (exit 0 pass or fail)."""


@check_group.command("math")
@click.argument("prediction")
@click.argument("gold")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="seconds allowed for symbolic work")
def check_math(prediction: str, gold: str, timeout: float) -> None:
    """Is PREDICTION (an answer or a whole solution) mathematically equivalent to GOLD?
    (extraction + math-verify)"""
    from refinery.verifiers.math import MathVerifier

    verdict = run_or_fail(MathVerifier(timeout=timeout).verify(
        Task.from_prompt("", id="cli"), prediction, gold))
    click.echo(verdict.model_dump_json())


@check_group.command("code")
@click.argument("candidate", type=_FILE)
@click.option("--tests", type=_FILE, required=True,
              help="Python file with the tests (e.g. a `check(candidate)`)")
@click.option("--entry-point", help="function to test: appends `check(ENTRY_POINT)`")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="wall-clock seconds for the run")
@click.option("--allow-unsandboxed", is_flag=True,
              help="run with rlimits only where bubblewrap is unavailable (unsafe)")
def check_code(candidate: Path, tests: Path, entry_point: str | None, timeout: float,
               allow_unsandboxed: bool) -> None:
    """Run CANDIDATE (a Python file) plus its tests in the sandbox."""
    from refinery.verifiers.code import CodeVerifier

    task = Task.from_prompt("", id="cli", metadata={
        "tests": tests.read_text(encoding="utf-8"), "entry_point": entry_point})
    try:
        verifier = CodeVerifier(wall_timeout=timeout, allow_unsandboxed=allow_unsandboxed)
    except RefineryError as e:
        fail(e)
    verdict = run_or_fail(verifier.verify(task, candidate.read_text(encoding="utf-8")))
    click.echo(verdict.model_dump_json())
