"""The ``refinery`` command line: one group per module, all of them mounted here.

``solve`` (generate, solve, graph, strategies, model-path, trace), ``serve``,
``ui``, ``eval``, ``tune``, ``distill`` and ``check`` (``verifiers``). Every group is
imported as it is: a broken module breaks ``refinery --help`` rather than
silently taking its commands away. Optional dependencies (vLLM's engine, ray,
trl, matplotlib) are imported inside the commands that need them, so the whole
help works with only the serving extras. Errors end as one ``error:`` line
(:class:`~refinery.cli.console.OneLineErrors`).

Example:
    >>> from click.testing import CliRunner
    >>> CliRunner().invoke(app, ["graph", "sc(cot, n=3)"]).output.splitlines()[-2]
    '%% spec: sc(cot, n=3)'
"""

from __future__ import annotations

import logging
import os
from typing import Any

import click

from refinery.cli.console import OneLineErrors
from refinery.cli.distill import distill_group
from refinery.cli.eval import eval_group
from refinery.cli.serve import serve
from refinery.cli.solve import COMMANDS
from refinery.cli.tune import tune_cmd
from refinery.cli.ui import ui
from refinery.cli.verifiers import check_group
from refinery.engine.console import interrupt_on_sigterm

__all__ = ["app", "main"]

# vLLM logs every engine detail to stdout; a CLI user wants the answer.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


@click.group("refinery", cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100})
def app() -> None:
    """refinery: inference-time reasoning and refinement engine."""


for command in (*COMMANDS, serve, ui, eval_group, tune_cmd, distill_group, check_group):
    app.add_command(command)


def main(args: list[str] | None = None) -> Any:
    """The console entry point (``refinery = "refinery.cli:main"``)."""
    interrupt_on_sigterm()  # `serve` sets its own
    # refinery's own INFO lines (which dtype the engine runs, and why) on stderr;
    # libraries stay at WARNING.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("refinery").setLevel(logging.INFO)
    return app.main(args, prog_name="refinery")
