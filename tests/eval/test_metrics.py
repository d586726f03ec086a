"""Metrics: pass@k against the reference formula, Wilson intervals, and the GSM8K harness
sanity check (gold solutions score 100%, empty answers 0%)."""

from __future__ import annotations

import asyncio
import math

import pytest

from refinery.eval.datasets import Example, load_gsm8k
from refinery.eval.metrics import (
    Scorer,
    accuracy,
    cost_summary,
    gsm8k_flexible_match,
    gsm8k_strict_match,
    mean_pass_at_k,
    pass_at_k,
    wilson_interval,
)

# (n, c, k): edge cases (c = 0, c = n, n - c < k, k = n) and ordinary ones
PASS_AT_K_CASES = [
    (1, 0, 1), (1, 1, 1), (5, 0, 1), (5, 5, 5), (5, 2, 1), (5, 2, 2), (5, 2, 3), (5, 2, 4),
    (10, 3, 1), (10, 3, 5), (10, 1, 10), (10, 9, 2), (20, 0, 10), (20, 7, 3), (50, 13, 10),
    (100, 1, 1), (100, 1, 50), (100, 37, 10), (200, 5, 100), (200, 199, 1), (200, 3, 198),
]


def reference_pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(("n", "c", "k"), PASS_AT_K_CASES)
def test_pass_at_k_matches_the_binomial_formula(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(reference_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_known_values_and_errors() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c < k
    assert mean_pass_at_k([(10, 3), (10, 0)], 1) == pytest.approx(0.15)
    for bad in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_wilson_interval_known_values() -> None:
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)
    assert wilson_interval(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-4)
    assert wilson_interval(81, 263) == pytest.approx((0.25529, 0.36621), abs=1e-4)  # by hand
    acc = accuracy([True, True, False, True])
    assert (acc.correct, acc.n, acc.value) == (3, 4, 0.75)
    assert (acc.low, acc.high) == pytest.approx((0.30064, 0.95441), abs=1e-4)
    assert str(acc) == "75.0% (30.1-95.4)"
    assert accuracy([]).n == 0 and (accuracy([]).low, accuracy([]).high) == (0.0, 1.0)


def test_gsm8k_filters_follow_the_harness() -> None:
    assert gsm8k_strict_match("x\n#### 1,000", "1000")
    assert not gsm8k_strict_match("The answer is 18.", "18")
    assert gsm8k_strict_match("The answer is 18.", "18", cot=True)
    assert gsm8k_flexible_match("The answer is 18.", "18")
    assert gsm8k_flexible_match("She pays $18.", "18")
    assert not gsm8k_flexible_match("18 then 19", "18")  # the LAST number counts
    assert not gsm8k_flexible_match("", "18")


async def test_gsm8k_gold_solutions_score_100_and_empty_answers_0() -> None:
    exs = load_gsm8k()
    assert len(exs) == 1319
    scorer = Scorer()

    async def rate(texts: list[str]) -> tuple[float, float, float]:
        scores = await asyncio.gather(*(scorer.score(e, t) for e, t in zip(exs, texts,
                                                                            strict=True)))
        n = len(scores)
        return (sum(s.passed for s in scores) / n, sum(s.strict_match for s in scores) / n,
                sum(s.flexible_match for s in scores) / n)

    assert await rate([e.private["solution"] for e in exs]) == (1.0, 1.0, 1.0)
    assert await rate(["" for _ in exs]) == (0.0, 0.0, 0.0)
    # another problem's solution: a real check would almost never accept it
    shifted = [exs[(i + 1) % len(exs)].private["solution"] for i in range(len(exs))]
    assert all(x < 0.05 for x in await rate(shifted))
    # the strategy's extracted answer alone (no text) is scored by the math verifier
    s = await scorer.score(exs[0], "blah", "18")
    assert s.passed and s.prediction == "18" and s.strict_match is False


async def test_scorer_uses_the_answer_and_records_prediction() -> None:
    ex = Example(id="q", prompt="half of one?", gold="0.5", verifier="math", dataset="x")
    s = await Scorer().score(ex, "It is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}")
    assert s.passed and s.score == 1.0 and s.prediction == "\\frac{1}{2}"
    assert s.strict_match is None and s.flexible_match is None  # not GSM8K
    s = await Scorer().score(ex, "It is \\boxed{3}.", None)
    assert not s.passed and s.prediction == "3"


def test_cost_summary_per_problem_and_wall_over_sessions() -> None:
    rows = [
        {"usage": {"prompt_tokens": 10, "completion_tokens": 30, "calls": 1}, "seconds": 2.0,
         "session": "a", "session_start": 100.0, "time": 104.0},
        {"usage": {"prompt_tokens": 20, "completion_tokens": 60, "calls": 3}, "seconds": 4.0,
         "session": "a", "session_start": 100.0, "time": 106.0, "error": "boom"},
        {"usage": {"prompt_tokens": 0, "completion_tokens": 0, "calls": 0}, "seconds": 0.0,
         "session": "b", "session_start": 200.0, "time": 203.0},
    ]
    c = cost_summary(rows)
    assert c.n == 3 and c.tokens == pytest.approx(40.0) and c.calls == pytest.approx(4 / 3)
    assert c.prompt_tokens == pytest.approx(10.0) and c.completion_tokens == pytest.approx(30.0)
    assert c.latency_seconds == pytest.approx(2.0) and c.errors == 1
    assert c.wall_seconds == pytest.approx((6.0 + 3.0) / 3)


def test_cost_summary_counts_garbled_fields_as_nothing_instead_of_failing() -> None:
    rows = [{"usage": {"prompt_tokens": 10, "completion_tokens": 30, "calls": 2},
             "seconds": 1.0},
            {"usage": [1, 2], "seconds": "slow"},
            {"usage": {"prompt_tokens": "many", "completion_tokens": True, "calls": None}},
            1, "row"]
    c = cost_summary(rows)  # type: ignore[arg-type]
    assert c.n == 3 and c.tokens == pytest.approx(40 / 3) and c.calls == pytest.approx(2 / 3)
    assert c.latency_seconds == pytest.approx(1 / 3) and c.wall_seconds is None
    assert cost_summary([{"session": ["a"], "session_start": 1.0, "time": 2.0}]).wall_seconds \
        is None
