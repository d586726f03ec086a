"""tune: dev runs per candidate (reused, adopted, never on test), the profile, the router."""

from __future__ import annotations

import json
import shutil

import pytest
from pydantic import ValidationError

from refinery.eval.arith import load_arith
from refinery.eval.tune import TuneConfig, candidate_of, fit_router, tune
from refinery.strategies.profile import Candidate, Profile
from tests.scripted_backend import ScriptedBackend

N = 12


def solver() -> ScriptedBackend:
    """cot right on levels 1-2; pot (a program) right on every problem but level 5."""
    gold = {e.prompt: (e.gold, e.level) for e in load_arith("train", limit=N)}

    def reply(messages, params, i) -> str:
        text = "\n".join(m.content for m in messages)
        question = next(q for q in gold if q in text)
        g, level = gold[question]
        if "python" in text.lower() or "program" in text.lower():
            return f"```python\nprint({g if level < 5 else int(g) + 1})\n```"
        return f"So \\boxed{{{g if level <= 2 else int(g) + 1}}}."

    return ScriptedBackend([(r".*", reply)])


def config(tmp_path, **kw) -> TuneConfig:
    return TuneConfig(dataset="arith", limit=N, out=str(tmp_path / "prof"), model="scripted",
                      max_tokens=64, spec=["cot", "pot"], **kw)


async def test_tune_writes_a_profile_and_reuses_its_runs(tmp_path) -> None:
    first = solver()
    profile = await tune(config(tmp_path), backend=first)
    assert len(first.calls) > 0
    cot, pot = profile.candidates
    assert (cot.candidate, cot.correct, cot.n) == (Candidate(spec="cot"), 6, N)
    assert (pot.candidate.spec, pot.correct) == ("pot", 10)
    assert Profile.load(tmp_path / "prof") == profile
    assert sorted(p.name for p in (tmp_path / "prof" / "runs").iterdir()) == ["cot-T0", "pot-T0"]
    again, ran = solver(), []

    async def runner(cfg, **kw):
        ran.append(cfg.strategy)

    assert await tune(config(tmp_path), backend=again, run=runner) == profile
    assert (len(again.calls), ran) == (0, [])


async def test_tune_adopts_a_run_dir_of_the_same_config(tmp_path) -> None:
    await tune(config(tmp_path), backend=solver())
    elsewhere = tmp_path / "m60"
    shutil.copytree(tmp_path / "prof" / "runs", elsewhere)
    fresh, ran = solver(), []

    async def runner(cfg, **kw):
        ran.append(cfg.strategy)

    cfg = config(tmp_path).model_copy(update={"out": str(tmp_path / "p2"),
                                              "adopt": [str(elsewhere)]})
    profile = await tune(cfg, backend=fresh, run=runner)
    assert (len(fresh.calls), ran) == (0, [])
    assert [c.correct for c in profile.candidates] == [6, 10]


def test_tune_refuses_the_test_split(tmp_path) -> None:
    with pytest.raises(ValidationError, match="the test split is for the final eval"):
        config(tmp_path, split="test")


def test_candidate_temperature() -> None:
    assert candidate_of("sc(cot, n=4)") == Candidate(spec="sc(cot, n=4)", temperature=0.7)
    assert candidate_of("tir") == Candidate(spec="tir", temperature=0.0)
    assert candidate_of("cot@0.5").key == "cot-T0.5"


async def test_router_retrains_to_the_same_choices(tmp_path) -> None:
    profile = await tune(config(tmp_path), backend=solver())
    examples = load_arith("train", limit=N)
    rows = [[json.loads(line) for line in
             (tmp_path / "prof" / "runs" / key / "results.jsonl").read_text().splitlines()]
            for key in ("cot-T0", "pot-T0")]
    again = fit_router(examples, rows, [c.tokens for c in profile.candidates],
                       profile.router.threshold, profile.fallback)
    assert again == profile.router
    choices = [profile.router.choose(e.prompt) for e in examples]
    assert choices == [again.choose(e.prompt) for e in examples]
    # cot (0) where the features say level 1-2, else pot (1); level 5, where no candidate
    # reaches the target, goes to the fallback (high: pot)
    assert choices == [0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0, 1]
    assert profile.router.threshold == pytest.approx(10 / 12) and profile.fallback == 1


def test_the_command_refuses_the_test_split(tmp_path) -> None:
    from click.testing import CliRunner

    from refinery.cli import app

    result = CliRunner().invoke(app, ["tune", "--dataset", "arith", "--split", "test",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--split: Value error, tune measures dev data (train)" in result.output
    assert not (tmp_path / "runs").exists()


async def test_the_report_marks_the_profile_levels(tmp_path) -> None:
    from refinery.eval.report import write_report

    await tune(config(tmp_path), backend=solver())
    runs = sorted((tmp_path / "prof" / "runs").iterdir())
    files = write_report(runs, tmp_path / "doc", name="arith")
    md = (tmp_path / "doc" / "arith.md").read_text()
    table = md.split("Effort levels of the tuned profile (points of the frontier):\n\n")[1]
    assert table.splitlines()[2:4] == [
        "| low | cot-T0 | `cot` | 50.0% (25.4–74.6) | 48.8 |",
        "| medium, high | pot-T0 | `pot` | 83.3% (55.2–95.3) | 119.8 |"]
    assert [p.rsplit("/", 1)[1] for p in files.images] == ["arith-arith-pareto.png",
                                                           "arith-arith-levels.png"]
