"""Stepwise-supervision rows from a real beam search's trace (scripted backend, the
arith scorer): the tree read back, labels from the outcomes below each step."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from refinery.cli.distill import distill_group as distill_app
from refinery.distill.schema import DistillError, StepwiseRow, read_rows
from refinery.distill.stepwise import build_stepwise, finished_paths
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Message
from refinery.strategies import build
from refinery.strategies.step_search import STEP_END
from tests.distill._runs import Problem, comp, write_run
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import QUESTION, ctx, task

RIGHT = "7 * 2 = 14. The answer is \\boxed{14}."
WRONG = "7 * 2 = 15. The answer is \\boxed{15}."


def reply(messages, params, i):
    """First steps 7, 8, 7, 8 (arith: right, wrong, ...); after "7." a right and a
    wrong ending."""
    last = messages[-1]
    if last.role != "assistant":
        return ["3 + 4 = 7.", "3 + 4 = 8."][i % 2]
    return [RIGHT, WRONG][i % 2] if last.content.count(STEP_END) == 1 else "done"


@pytest.fixture
async def beam_run(tmp_path):
    c = ctx(ScriptedBackend([(r".*", reply)]))
    attempt = await build('beam(scorer="arith", width=2, expand=2, max_steps=3)').solve(
        task(), c)
    problem = Problem(id="t1", prompt=QUESTION, gold="14", events=c.trace.events,
                      final=attempt.text, final_events=attempt.events, strategy="beam")
    return write_run(tmp_path, "beam", [problem], record_task=True)


def test_the_searchs_finished_paths_come_back_with_their_step_scores(beam_run):
    [trace] = [json.loads(line) for line in (beam_run / "traces.jsonl").open()]
    paths = finished_paths(Trace.model_validate(trace))
    assert sorted((p.steps, p.scores, p.answer) for p in paths) == [
        (("3 + 4 = 7.", RIGHT), (1.0, 1.0), "14"),
        (("3 + 4 = 7.", WRONG), (1.0, 0.0), "15")]  # "8." was pruned: it never finished


def test_labels_follow_the_outcomes_below_each_step(beam_run, tmp_path):
    out = tmp_path / "prm.jsonl"
    stats = build_stepwise([beam_run], out)
    rows = sorted(read_rows(out, "stepwise"), key=lambda r: r.completions[-1])
    assert [(r.completions, r.labels) for r in rows] == [
        (["3 + 4 = 7.", RIGHT], [True, True]),
        (["3 + 4 = 7.", WRONG], [True, False])]  # right up to where it left the right path
    assert all(r.prompt == QUESTION and "14" not in r.prompt for r in rows)
    assert [r.metadata.correct for r in rows] == [True, False]
    assert (stats.rows, stats.right_steps, stats.wrong_steps) == (2, 3, 1)
    line = json.loads(out.read_text().splitlines()[0])
    assert set(line) == {"prompt", "completions", "labels", "metadata"}  # TRL's columns


def test_runs_without_a_search_or_without_gold(tmp_path, beam_run):
    cot = write_run(tmp_path, "cot", [Problem(id="q", prompt="1+1?", gold="2", events=[],
                                              final="\\boxed{2}")])
    with pytest.raises(DistillError, match="no trace of a step search"):
        build_stepwise([cot], tmp_path / "x.jsonl")
    (beam_run / "results.jsonl").unlink()
    lines = (beam_run / "traces.jsonl").read_text().replace('"gold":"14"', '"gold":null')
    (beam_run / "traces.jsonl").write_text(lines)
    stats = build_stepwise([beam_run], tmp_path / "y.jsonl")
    assert (stats.searched, stats.without_gold, stats.rows) == (1, 1, 0)


def test_a_row_needs_a_label_and_a_score_per_step():
    with pytest.raises(ValidationError, match="one label and one score per step"):
        StepwiseRow(prompt="?", completions=["a", "b"], labels=[True], metadata={
            "source_run": "r", "problem_id": "p", "strategy": "beam", "correct": True,
            "scores": [1.0, 1.0]})


def test_distill_build_prm_on_the_command_line(beam_run, tmp_path):
    out = tmp_path / "prm.jsonl"
    res = CliRunner().invoke(distill_app, ["build", "--runs", str(beam_run), "--prm", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 2 stepwise rows" in res.output and len(out.read_text().splitlines()) == 2
    res = CliRunner().invoke(distill_app, ["build", "--runs", str(beam_run)])
    assert res.exit_code != 0 and "--prm" in res.output
    lone = tmp_path / "lone.jsonl"
    res = CliRunner().invoke(distill_app, ["build", "--runs", str(beam_run), "--prm", str(lone),
                                           "--pairs", str(tmp_path / "pairs.jsonl")])
    assert res.exit_code != 0 and "--pairs comes with --sft" in res.output
    assert not lone.exists()  # refused before anything was written


def test_a_path_longer_than_the_judges_cap_is_read_back_whole():
    so_far = STEP_END.join(f"step {i}: {i} + 1 = {i + 1}" for i in range(20)) + STEP_END
    events = [TraceEvent(id="s", kind="step", step="search", strategy="beam"),
              TraceEvent(id="g", kind="generation", step="continue", strategy="beam",
                         messages=[Message(role="user", content=QUESTION),
                                   Message(role="assistant", content=so_far)],
                         completions=[comp(RIGHT)])]
    [path] = finished_paths(Trace(task_id="t1", events=events))
    assert len(path.steps) == 21 and path.steps[-1] == RIGHT and path.answer == "14"
