"""The profile: Wilson values, the frontier of a hand-made set, monotone levels, save/load."""

from __future__ import annotations

import pytest

from refinery.engine.errors import InvalidRequestError
from refinery.strategies.profile import (
    LEVELS,
    SHIPPED,
    Candidate,
    CandidateStats,
    Profile,
    Router,
    question_features,
    wilson_interval,
)


def _stats(spec: str, correct: int, n: int, tokens: float, t: float = 0.0) -> CandidateStats:
    return CandidateStats.of(Candidate(spec=spec, temperature=t),
                             [True] * correct + [False] * (n - correct),
                             tokens=tokens, calls=1.0, seconds=1.0)


def test_wilson_values() -> None:
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.25529, 0.36621), abs=1e-4)
    s = _stats("cot", 3, 4, 100)
    assert (s.accuracy, round(s.low, 4), round(s.high, 4)) == (0.75, 0.3006, 0.9544)


def test_frontier_and_levels_of_a_hand_made_set() -> None:
    stats = [_stats("cot", 40, 200, 300),          # 0: cheapest
             _stats("tir", 30, 200, 500),          # 1: dearer and worse than cot
             _stats("pot", 110, 200, 250),         # 2: cheaper and better than cot
             _stats("sc(pot, n=4)", 120, 200, 1000, 0.7),   # 3: a little better, 4x dearer
             _stats("sc(cot, n=16)", 100, 200, 4000, 0.7),  # 4: dominated
             _stats("pot2", 110, 200, 250)]        # 5: the same point as pot
    p = Profile.build("arith", "m", stats)
    assert p.frontier == [2, 3]
    # 110/200 lies inside sc(pot)'s interval (0.53-0.67): medium is pot, as is low
    assert p.levels == {"low": 2, "medium": 2, "high": 3}
    assert p.fallback == 3


def test_levels_are_monotone_on_the_dev_data() -> None:
    stats = [_stats(f"s{i}", c, 100, tok) for i, (c, tok) in
             enumerate([(10, 50), (30, 100), (35, 120), (60, 400), (62, 900), (20, 2000)])]
    p = Profile.build("arith", "m", stats)
    acc = [p.level(name).accuracy for name in ("low", "medium", "high")]
    tokens = [p.level(name).tokens for name in ("low", "medium", "high")]
    assert acc == [0.1, 0.6, 0.62] and tokens == [50, 400, 900]
    with pytest.raises(InvalidRequestError, match="unknown effort level 'max'"):
        p.level("max")


def test_save_load_round_trip_and_a_missing_profile(tmp_path) -> None:
    router = Router(mean=[0.0] * 8, scale=[1.0] * 8, weights=[[2.0] + [0.0] * 8,
                                                              [-2.0] + [0.0] * 8],
                    order=[1, 0], threshold=0.5, fallback=0)
    p = Profile.build("arith", "m", [_stats("cot", 1, 4, 10), _stats("pot", 3, 4, 20)])
    p = p.model_copy(update={"router": router})
    p.save(tmp_path)
    back = Profile.load(tmp_path)
    assert back == p
    assert back.router.choose("What is 2 + 3?") == 0  # 1 is cheaper but predicts 0.12
    with pytest.raises(InvalidRequestError, match="no profile at .*write one with"):
        Profile.load(tmp_path / "none")


def test_question_features() -> None:
    assert question_features("def f(x): return x^2 = 1234.5") == [
        3.4012, 6.0, 2.0, 5.0, 3.0, 0.0, 2.0, 2.0]


def test_the_shipped_arith_profile_loads_with_monotone_levels_and_a_router() -> None:
    profile = Profile.load(SHIPPED / "arith")
    assert (profile.dataset, profile.model) == ("arith", "smollm2-135m")
    specs = {name: profile.candidates[i].candidate.spec for name, i in profile.levels.items()}
    assert specs == {"low": "cot", "medium": "pot",
                     "high": "cascade(pot, sc(pot, n=8), until=ran)"}
    accuracy = [profile.candidates[profile.levels[x]].accuracy for x in LEVELS]
    assert accuracy == sorted(accuracy) and profile.router is not None
