"""One error style: an ``error:`` line and a status decided by the error's type."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import BaseModel, Field, ValidationError

from refinery.cli import app
from refinery.cli.console import USAGE, Failure, bad_option, exit_status, fail
from refinery.engine.errors import (
    BackendUnavailableError,
    EngineStartError,
    InvalidRequestError,
    SpecError,
    StorageError,
    UnknownModelError,
)


@pytest.mark.parametrize(("exc", "status"), [
    (SpecError("bad spec"), 2), (UnknownModelError("no model"), 2),
    (InvalidRequestError("bad"), 2), (EngineStartError("no memory"), 1),
    (BackendUnavailableError("dead"), 1), (StorageError("disk full"), 1),
    (RuntimeError("bug"), 1)])
def test_exit_status_is_decided_by_the_error_type(exc, status) -> None:
    assert exit_status(exc) == status
    with pytest.raises(Failure) as raised:
        fail(exc)
    assert raised.value.exit_code == status


def test_fail_with_a_message_takes_the_status_given() -> None:
    with pytest.raises(Failure) as raised:
        fail("interrupted", 130)
    assert (raised.value.exit_code, raised.value.format_message()) == (130, "interrupted")


def test_a_refused_option_names_its_flag() -> None:
    class Config(BaseModel):
        max_concurrency: int = Field(ge=1)

    with pytest.raises(ValidationError) as refused:
        Config(max_concurrency=0)
    with pytest.raises(Failure) as exited:
        bad_option(refused.value)
    assert exited.value.exit_code == USAGE
    assert exited.value.format_message() == \
        "--max-concurrency: Input should be greater than or equal to 1"


@pytest.mark.parametrize(("argv", "line"), [
    (["nope"], "error: No such command 'nope'. (see 'refinery --help')\n"),
    (["eval", "run", "--dataset", "arith"],
     "error: Missing option '--strategy'. (see 'refinery eval run --help')\n"),
    (["graph", "sc(cot, n="], None),
    (["trace", "show", "/nonexistent/t.jsonl"], None),
])
def test_every_error_is_one_line_and_a_status(argv, line) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output and "╭" not in result.output
    if line is not None:
        assert result.output == line


@pytest.mark.parametrize("argv", [[], ["eval"], ["distill"], ["check"], ["trace"]])
def test_a_bare_group_prints_its_help_not_an_error(argv) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert result.output.startswith(f"Usage: refinery {' '.join(argv)}".rstrip() + " [OPTIONS]")
    assert "error:" not in result.output and "Commands:" in result.output
