"""``refinery distill``: build writes and reports its rows; bad input is one line, status 2."""

from __future__ import annotations

from click.testing import CliRunner

from refinery.cli import app
from refinery.distill.schema import read_rows
from tests.distill._runs import write_run
from tests.distill.test_dataset import Q1, RIGHT_1, WRONG_1, refine_problem, sc_problem

runner = CliRunner()


def distill(*args: str):
    return runner.invoke(app, ["distill", *args])


def test_build_writes_rows_and_reports(tmp_path) -> None:
    run = write_run(tmp_path, "run", [refine_problem()])
    res = distill("build", "--runs", str(run), "--sft", str(tmp_path / "s.jsonl"), "--pairs",
                  str(tmp_path / "p.jsonl"), "--cot-instruction")
    assert res.exit_code == 0, res.output
    assert "wrote 1 SFT rows (weighted 2)" in res.output and "1 pairs" in res.output
    [row] = read_rows(tmp_path / "s.jsonl", "sft")
    assert row.messages[0].content.startswith(Q1 + "\n\n")
    assert row.messages[-1].content == RIGHT_1


def test_bad_input_exits_2_with_one_line(tmp_path) -> None:
    res = distill("build", "--runs", str(tmp_path / "nope"), "--sft", str(tmp_path / "s.jsonl"))
    assert res.exit_code == 2 and "does not exist" in res.output
    # A run whose problems all fail: nothing to train on.
    run = write_run(tmp_path, "bad", [sc_problem("p1", Q1, [WRONG_1], "7")])
    res = distill("build", "--runs", str(run), "--sft", str(tmp_path / "s.jsonl"))
    assert res.exit_code == 2 and "no verified SFT rows" in res.output
    res = distill("train", "--sft-path", str(tmp_path / "missing.jsonl"), "--out",
                  str(tmp_path / "m"))
    assert res.exit_code == 2 and "does not exist" in res.output
    assert res.output.startswith("error: ") and res.output.count("\n") == 1
    res = distill("train", "--sft-path", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "m"))
    assert res.exit_code == 2 and "no sft rows" in res.output
    res = distill("loop", "--dataset", "nope", "--out", str(tmp_path / "loop"))
    assert res.exit_code == 2 and "unknown dataset" in res.output


def test_a_train_setting_of_the_loop_is_checked_by_train_config(tmp_path) -> None:
    res = distill("loop", "--train", "learning_rate", "--out", str(tmp_path / "loop"))
    assert (res.exit_code, res.output) == (
        2, "error: --train: expected KEY=VALUE, got 'learning_rate'\n")
    res = distill("train", "--sft-path", "s.jsonl", "--out", "m", "--learning-rate", "0")
    assert res.exit_code == 2 and res.output.startswith("error: Invalid value for "
                                                        "'--learning-rate'")
