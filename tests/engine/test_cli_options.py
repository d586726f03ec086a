"""The shared CLI options: one loop policy vocabulary, and each alias checks what it says."""

from __future__ import annotations

from typing import get_args

import pytest
import typer
from typer.testing import CliRunner

from refinery.engine.cli_options import (
    LoopPolicyKind,
    LoopPolicyOption,
    MaxTokensOption,
    ModelOption,
    RayOption,
    TemperatureOption,
)
from refinery.engine.context import LoopPolicy


def test_the_loop_policy_choices_are_the_engines():
    assert [k.value for k in LoopPolicyKind] == list(get_args(LoopPolicy))


def _app() -> typer.Typer:
    """One command taking the aliases under other names, as ``distill`` does (``--base``)."""
    app = typer.Typer()

    @app.command()
    def run(base: ModelOption = "m", sample_temperature: TemperatureOption = 0.7,
            max_tokens: MaxTokensOption = 8, loop_policy: LoopPolicyOption = LoopPolicyKind.retry,
            ray: RayOption = False) -> None:
        typer.echo(f"{base} {sample_temperature} {max_tokens} {loop_policy.value} {ray}")

    return app


def test_an_alias_takes_its_flag_from_the_parameter_and_the_default_from_the_command():
    assert CliRunner().invoke(_app(), []).output == "m 0.7 8 retry False\n"
    result = CliRunner().invoke(_app(), ["--base", "x", "--sample-temperature", "0",
                                         "--loop-policy", "off", "--ray"])
    assert result.output == "x 0.0 8 off True\n"


@pytest.mark.parametrize("flags", [["--sample-temperature", "2.5"], ["--max-tokens", "0"],
                                   ["--loop-policy", "sometimes"], ["--no-ray"]])
def test_an_alias_refuses_what_its_range_or_choices_refuse(flags):
    assert CliRunner().invoke(_app(), flags).exit_code == 2
