"""``refinery eval``: errors are one line and exit code 2 (no traceback); report prints;
Ctrl-C drains a run, a second Ctrl-C stops it."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest
from click.testing import CliRunner

from refinery.cli import app
from refinery.cli.eval import _drain_on_interrupt
from refinery.eval.runner import RESULTS, read_results, run_eval
from tests.eval._resume_worker import backend, config
from tests.eval.test_report import make_run
from tests.eval.test_runner import first_call_does

runner = CliRunner()


def run(*args: str):
    result = runner.invoke(app, ["eval", *args])
    return result, result.output  # stdout and stderr


def test_bad_dataset_and_bad_spec_exit_2_without_traceback(tmp_path) -> None:
    out = str(tmp_path / "r")
    res, text = run("run", "--dataset", "gsm9k", "--strategy", "cot", "--out", out)
    assert res.exit_code == 2 and "unknown dataset 'gsm9k'" in text
    assert "Traceback" not in text
    res, text = run("run", "--dataset", "arith", "--strategy", "sc(cot, n=", "--out", out)
    assert res.exit_code == 2 and "does not parse" in text and "Traceback" not in text
    res, text = run("run", "--dataset", "arith", "--strategy", "cott", "--out", out)
    assert res.exit_code == 2 and "unknown strategy 'cott'" in text
    res, text = run("run", "--dataset", "arith", "--strategy", "cot", "--out", out,
                    "--fields", "prompt")
    assert (res.exit_code, text) == (2, "error: --fields: expected KEY=VALUE, got 'prompt'\n")
    res, text = run("run", "--dataset", "arith", "--strategy", "cot", "--out", out,
                    "--backend", "openai")
    assert res.exit_code == 2 and "--base-url" in text
    res, text = run("run", "--dataset", "arith", "--strategy", "cot", "--out", out,
                    "--skip", "-1")
    assert res.exit_code == 2 and "--skip" in text and "Traceback" not in text


def test_resuming_into_a_different_run_exits_2(tmp_path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"identity": {"strategy": "ssr"}}))
    res, text = run("run", "--dataset", "arith", "--strategy", "cot", "--limit", "3",
                    "--out", str(out))
    assert res.exit_code == 2 and "different configuration" in text and "--force" in text


def test_report_command(tmp_path) -> None:
    a = make_run(tmp_path / "a", "cot", [True, False], 10, 1, 1.0)
    res, text = run("report", str(a), "--out", str(tmp_path / "docs"), "--name", "x")
    assert res.exit_code == 0, text
    assert "50.0% (9.5–90.5)" in text and (tmp_path / "docs" / "x.md").exists()
    assert (tmp_path / "docs" / "img" / "x-arith-pareto.png").exists()
    res, text = run("report", str(tmp_path), "--out", str(tmp_path / "docs"))
    assert res.exit_code == 2 and "not a run directory" in text


def ctrl_c(times: int):
    def press() -> None:
        for _ in range(times):
            os.kill(os.getpid(), signal.SIGINT)
    return press


async def test_first_ctrl_c_finishes_the_problems_in_flight(tmp_path) -> None:
    out = str(tmp_path / "run")
    summary, drained = await asyncio.create_task(_drain_on_interrupt(
        config(out, 10), backend=first_call_does(ctrl_c(1)), progress=False))
    assert drained and (summary.done, summary.total) == (4, 10)  # concurrency 4
    assert len(read_results(tmp_path / "run" / RESULTS)) == 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler removed


async def test_a_second_ctrl_c_stops_at_once_and_the_rerun_finishes(tmp_path) -> None:
    out = str(tmp_path / "run")
    run = asyncio.create_task(_drain_on_interrupt(
        config(out, 10), backend=first_call_does(ctrl_c(2)), progress=False))
    with pytest.raises(asyncio.CancelledError):
        await run
    assert len(read_results(tmp_path / "run" / RESULTS)) < 4
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    again = await run_eval(config(out, 10), backend=backend(0), progress=False)
    assert again.done == 10 and len(read_results(tmp_path / "run" / RESULTS)) == 10
