"""auto: per question, the candidate a profile's router picks, run at its temperature."""

from __future__ import annotations

import pytest

from refinery.engine.errors import SpecError
from refinery.engine.types import SamplingParams
from refinery.strategies import build
from refinery.strategies.auto import Auto
from refinery.strategies.profile import FEATURES, Candidate, CandidateStats, Profile, Router
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task

PROGRAM = "```python\ndef solution():\n    return 3 + 4 + 5\n```"


def profile_dir(tmp_path) -> str:
    """cot (cheap, T=0) for questions with few numbers, pot (T=0.3) for the rest."""
    stats = [CandidateStats.of(Candidate(spec="cot"), [True, False], tokens=50, calls=1,
                               seconds=1),
             CandidateStats.of(Candidate(spec="pot", temperature=0.3), [True, True],
                               tokens=90, calls=1, seconds=1)]
    numbers = FEATURES.index("numbers")
    cot = [4.0] + [-2.0 if k == numbers else 0.0 for k in range(len(FEATURES))]
    router = Router(mean=[0.0] * 8, scale=[1.0] * 8, weights=[cot, [3.0] + [0.0] * 8],
                    order=[0, 1], threshold=0.5, fallback=1)
    profile = Profile.build("arith", "scripted", stats).model_copy(update={"router": router})
    profile.save(tmp_path)
    return str(tmp_path)


def backend() -> ScriptedBackend:
    return ScriptedBackend([(r"def solution", PROGRAM), (r".*", "So \\boxed{5}.")])


async def test_each_question_goes_to_its_candidate_at_its_temperature(tmp_path) -> None:
    auto = build(f'auto(profile="{profile_dir(tmp_path)}")')
    be = backend()
    hot = dict(params=SamplingParams(temperature=0.7))
    easy = await auto.solve(task("What is 2 + 3?"), ctx(be, **hot))
    hard = await auto.solve(task("Add 3, 4 and 5."), ctx(be, **hot))
    assert (easy.answer, easy.metadata["auto"]) == ("5", {
        "candidate": "cot", "temperature": 0.0, "level": "router", "chance": 0.5})
    assert (hard.answer, hard.metadata["auto"]["candidate"]) == ("12", "pot")
    assert [c.params.temperature for c in be.calls] == [0.0, 0.3]


async def test_a_level_runs_on_every_question(tmp_path) -> None:
    auto = Auto(profile=profile_dir(tmp_path), level="low")
    attempt = await auto.solve(task("Add 3, 4 and 5."), ctx(backend()))
    assert attempt.metadata["auto"]["candidate"] == "cot"


def test_a_missing_profile_is_a_spec_error(tmp_path) -> None:
    with pytest.raises(SpecError, match="auto: no profile at .*refinery tune"):
        build(f'auto(profile="{tmp_path}/none")')
    assert build(f'auto(profile="{profile_dir(tmp_path)}")').params.level == "router"
