"""The arithmetic step scorer: which equations a step writes, their exact recomputation, scores."""

from __future__ import annotations

import time
from fractions import Fraction as F

import pytest

from refinery.engine.types import Task
from refinery.verifiers.step_arith import (
    RIGHT,
    UNCHECKED,
    WRONG,
    ArithStepScorer,
    EquationCheck,
    check_step,
)
from refinery.verifiers.steps import StepScorer, aggregate

TASK = Task.from_prompt("Janet buys 5 boxes of 12 eggs. How many eggs?")

# (step, right?, recomputed value): each step writes exactly one equation.
EQUATIONS = [
    # a op b = c, precedence, parentheses, unary minus
    ("3 + 4 = 7", True, F(7)),
    ("3 + 4 = 8", False, F(7)),
    ("2 + 3 * 4 = 14", True, F(14)),
    ("2 + 3 * 4 = 20", False, F(14)),
    ("(2 + 3) * 4 = 20", True, F(20)),
    ("10 - 3 - 2 = 5", True, F(5)),
    ("12 / 4 / 3 = 9", False, F(1)),
    ("-3 + 5 = 2", True, F(2)),
    ("so -5 + 3 = -2", True, F(-2)),
    ("5 * -2 = -10", True, F(-10)),
    ("-(3 + 4) = 7", False, F(-7)),
    ("2^10 = 1024", True, F(1024)),
    ("-2^2 = 4", False, F(-4)),
    # every multiplication and division sign
    ("5 x 12 = 60", True, F(60)),
    ("5x12=60", True, F(60)),
    ("6 × 7 = 48", False, F(42)),
    ("12 ÷ 4 = 3", True, F(3)),
    ("10 · 3 = 30", True, F(30)),
    ("7 − 2 = 5", True, F(5)),
    # numbers as written in word problems
    ("1,234 + 766 = 2,000", True, F(2000)),
    ("1,234 + 766 = 2,100", False, F(2000)),
    ("$12.50 * 2 = $25", True, F(25)),
    ("$3.50 + $1.25 = $4.85", False, F(19, 4)),
    ("0.1 + 0.2 = 0.3", True, F(3, 10)),
    ("7 apples + 3 apples = 10 apples", True, F(10)),
    ("5 boxes * 12 = 60", True, F(60)),
    ("5 boxes * 12 = 50 eggs", False, F(60)),
    ("5 boxes x 12 = 60", True, F(60)),
    ("5 dollars per hour * 8 hours = 40 dollars", True, F(40)),
    ("60 miles/hour * 2 hours = 120 miles", True, F(120)),
    ("120 / 2 = 60 miles/hour", True, F(60)),
    ("5kg * 2 = 10kg", True, F(10)),
    ("<<16-3-4=9>>9", True, F(9)),
    ("Weng earns 12/60 = $0.2 per minute.", True, F(1, 5)),
    # percentages and fractions
    ("20% of 50 = 10", True, F(10)),
    ("20% of 50 = 25", False, F(10)),
    ("20 percent of 50 = 10", True, F(10)),
    ("50 * 20% = 10", True, F(10)),
    ("0.2 * 50 = 10", True, F(10)),
    ("10 / 50 = 20%", True, F(1, 5)),
    ("0.2 * 100 = 20%", True, F(20)),
    ("5% + 3% = 8%", True, F(2, 25)),
    ("3/4 of 12 = 9", True, F(9)),
    ("3/4 of 12 = 8", False, F(9)),
    ("1/2 + 1/3 = 5/6", True, F(5, 6)),
    # LaTeX
    (r"$\frac{3}{4} \times 12 = 9$", True, F(9)),
    (r"$12 \div 4 = 4$", False, F(3)),
    (r"\frac{1}{2} + \frac{1}{4} = \frac{3}{4}", True, F(3, 4)),
    (r"\dfrac34 * 4 = 3", True, F(3)),
    (r"$10 \cdot 3 = 30$", True, F(30)),
    (r"3 + 4 = \boxed{7}", True, F(7)),
    ("3 + 4 = **8**", False, F(7)),
    # a stated result rounded to the precision it is written with
    ("10 / 3 = 3.33", True, F(10, 3)),
    ("10 / 3 = 3.3", True, F(10, 3)),
    ("10 / 3 = 3.4", False, F(10, 3)),
    ("10 / 3 = 3", False, F(10, 3)),
    ("10 / 3 ≈ 3", True, F(10, 3)),
    ("2/3 = 0.67", True, F(2, 3)),
    ("2/3 = 0.66", False, F(2, 3)),
    ("2/3 = 0.666...", True, F(2, 3)),
    ("$10 / 3 = $3.33", True, F(10, 3)),
    ("1/3 = 33.3%", True, F(1, 3)),
    ("1/3 = 33%", False, F(1, 3)),
    ("12 * 1.5 = 18.0", True, F(18)),
    # where an equation sits in prose or markup
    ("1. 3 + 4 = 7", True, F(7)),
    ("2) 3 + 4 = 8", False, F(7)),
    ("- 3 + 4 = 7", True, F(7)),
    ("(3 + 4 = 7)", True, F(7)),
    ("**3 + 4 = 7**", True, F(7)),
    ("Is 5 - 3 = 2?", True, F(2)),
    ("Total = 5 * 12 = 60", True, F(60)),
    ("x = 3 + 4 = 8", False, F(7)),
    ("The meeting is at 3:45, and 2 * 15 = 30 minutes.", True, F(30)),
    ("5 / 0 = 0", False, None),
]


@pytest.mark.parametrize(("step", "ok", "value"), EQUATIONS)
def test_each_equation_is_recomputed_exactly(step: str, ok: bool, value: F | None) -> None:
    check = check_step(step)
    assert len(check.equations) == 1, check
    eq = check.equations[0]
    assert (eq.ok, eq.value) == (ok, value)
    assert check.score == (RIGHT if ok else WRONG)


def test_the_table_covers_right_and_wrong() -> None:
    verdicts = [ok for _, ok, _ in EQUATIONS]
    assert verdicts.count(True) >= 30 and verdicts.count(False) >= 15


# Text that only looks like an equation, or whose arithmetic this calculator
# does not read: nothing is checked, so the step is neutral rather than wrong.
NOT_EQUATIONS = [
    "On 2023-10-05 she had 3 apples.",
    "The bill is dated 12/25/2023 = Christmas.",
    "The meeting is at 3:45 and 3:45 + 15 = 4:00",
    "The ratio is 3:4 = 0.75",
    "It takes 3-4 hours.",
    "Ages 5-10 = the junior group",
    "3-10=-7",
    "x = 5",
    "Let x = 5. Then 2 * x = 10",
    "a_2 = 3 + 4",
    "She has 5 apples = 5.",
    "1 hour = 60 minutes",
    "2x + 3 = 7",
    "x - 3 = 2",
    "x_1 + 2 = 3",
    "Total - 3 = 12",
    "3 + 4 = 7x",
    "f(3) + 4 = 7",
    "2(3 + 4) = 14",
    "sqrt 16 + 9 = 5",
    r"\sqrt{16} + 9 = 13",
    r"\frac{x}{2} = 3",
    "3 + 4 squared = 49",
    "12 divided by 3 + 1 = 5",
    "3 times 4 + 1 = 13",
    "2 hours + 30 minutes = 2.5 hours",
    "50 + 10% = 55",
    "2 dozen + 6 = 30",
    "1.5 million * 2 = 3 million",
    "1 1/2 * 2 = 3",
    "6 / 4 = 1 1/2",
    "3,5 + 1 = 4,5",
    "5! = 120",
    "3 * 4 <= 12",
    "3 + 4 == 7",
    "Then 40 - 10 = 20 + bonus",
    "The answer is 42.",
    "First, count the boxes.",
    "",
]


@pytest.mark.parametrize("step", NOT_EQUATIONS)
def test_what_is_not_an_equation_is_not_checked(step: str) -> None:
    check = check_step(step)
    assert check.equations == (), check
    assert check.score == UNCHECKED


def test_chains_check_every_link() -> None:
    links = check_step("a * b: 3 * 4 = 12 = 12.0").equations
    assert [(e.text, e.ok) for e in links] == [("3 * 4 = 12", True), ("12 = 12.0", True)]
    links = check_step("3 * 4 = 12 = 13").equations
    assert [e.ok for e in links] == [True, False]
    assert (links[1].value, links[1].stated) == (F(12), F(13))
    links = check_step("10 / 3 = 3.33, so 3.33 * 3 = 9.99 = 10").equations
    assert [e.ok for e in links] == [True, True, False]
    links = check_step("3 + 4 = 7 = 8 - 1").equations
    assert [e.ok for e in links] == [True, True]


def test_a_running_total_is_read_link_by_link() -> None:
    # "= 6 * 2" continues from 6; the first link says 2 * 3 = 6.
    links = check_step("2 * 3 = 6 * 2 = 12").equations
    assert [(e.text, e.ok) for e in links] == [("2 * 3 = 6", True), ("6 * 2 = 12", True)]
    assert [e.ok for e in check_step("2 + 3 = 5 * 2 = 11").equations] == [True, False]


def test_several_equations_in_one_step() -> None:
    check = check_step("She buys 3 * 4 = 12 eggs,\nthen eats 2: 12 - 2 = 9.\n#### 9")
    assert [(e.text, e.ok, e.value) for e in check.equations] == [
        ("3 * 4 = 12", True, F(12)), ("12 - 2 = 9", False, F(10))]
    assert check.wrong == (check.equations[1],)
    assert check.score == WRONG


def test_three_score_levels() -> None:
    assert check_step("3 * 12 = 36 eggs").score == RIGHT == 1.0
    assert check_step("3 * 12 = 36 eggs, minus 5 is 36 - 5 = 30").score == WRONG == 0.0
    assert check_step("She buys three packs of a dozen eggs.").score == UNCHECKED == 0.5


def test_describe_says_what_was_recomputed() -> None:
    assert check_step("3 * 4 = 11").equations[0].describe() == "3 * 4 = 11: wrong, it is 12"
    assert check_step("10 / 3 = 3.4").equations[0].describe() == "10 / 3 = 3.4: wrong, it is 10/3"
    assert check_step("7 / 2 = 3.5").equations[0].describe() == "7 / 2 = 3.5: right"
    assert check_step("5 / 0 = 0").equations[0].describe() == "5 / 0 = 0: wrong, it divides by zero"
    eq = check_step("1,234.50 * 2 = 2,469").equations[0]
    assert eq == EquationCheck("1,234.50 * 2 = 2,469", True, F(2469), F(2469))


@pytest.mark.parametrize("step", [
    "(" * 5000 + "1" + ")" * 5000 + " = 1",
    "-" * 5000 + "1 = 1",
    "9" * 5000 + " + 1 = 1",
    "2^64^64 = 1",
    "2 * " * 3000 + "2 = 1",
    " = ".join(["1 + 1"] * 2000),
])
def test_hostile_text_is_quick_and_never_raises(step: str) -> None:
    # CPU seconds of this thread, not wall time: the work the check does, however long a
    # loaded machine keeps it waiting for a core.
    started = time.thread_time()
    check = check_step(step)
    assert time.thread_time() - started < 2.0
    assert check.score in (RIGHT, WRONG, UNCHECKED)


def test_a_huge_wrong_value_still_describes_itself() -> None:
    eq = check_step(("9" * 150 + " * ") * 40 + "1 = 1").equations[0]
    assert not eq.ok and eq.describe().endswith("it is a number too long to print")


def test_it_is_a_step_scorer() -> None:
    scorer = ArithStepScorer()
    assert isinstance(scorer, StepScorer)
    assert scorer.name == "arith"


async def test_score_returns_one_score_per_step_of_each_path() -> None:
    paths = [
        ["Janet buys 5 boxes.", "5 boxes * 12 = 60 eggs", "60 - 6 = 54 eggs are left"],
        ["5 * 12 = 62", "62 / 2 = 31"],
        [],
    ]
    scores = await ArithStepScorer().score(TASK, paths, ctx=None)
    assert scores == [[UNCHECKED, RIGHT, RIGHT], [WRONG, RIGHT], []]
    assert aggregate(scores[0], "min") == UNCHECKED and aggregate(scores[1], "min") == WRONG
    assert await ArithStepScorer().score(TASK, [], ctx=None) == []
