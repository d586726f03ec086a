"""Each signal sure and unsure on real attempts (scripted backend, real sandbox), and the
registry's parse errors."""

from __future__ import annotations

import pytest

from refinery.engine.errors import SpecError
from refinery.engine.types import Attempt, Task
from refinery.strategies import build
from refinery.strategies.cot import CoT
from refinery.strategies.signals import SIGNALS, Reading, build_signal
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ctx, task
from tests.strategies.test_pot import NOTHING, RIGHT


async def read(signal: str, attempt: Attempt, c=None, on: Task | None = None) -> Reading:
    c = c or ctx(ScriptedBackend([]))
    return await build_signal(signal).read(on or task(), attempt, c)


async def solved(spec: str, reply: str):
    c = ctx(ScriptedBackend([(r".*", reply)]))
    return await build(spec).solve(task(), c), c


async def test_ran_is_sure_when_a_program_printed_the_answer():
    attempt, c = await solved("pot", RIGHT)
    assert (await read("ran", attempt, c)).sure
    voted, c = await solved("sc(pot, n=2)", RIGHT)  # read through the vote's trace
    assert (await read("ran", voted, c)) == Reading("ran", True, None, True)


async def test_ran_is_unsure_when_no_program_ran_or_there_is_no_program():
    attempt, c = await solved("pot(repairs=0)", NOTHING)
    assert (await read("ran", attempt, c)) == Reading("ran", False, None, False)
    attempt, c = await solved("cot", "The answer is \\boxed{14}.")
    assert not (await read("ran", attempt, c)).sure


async def test_margin_reads_the_votes_lead():
    attempt = Attempt(text="4", answer="4", metadata={"votes": {"4": 3, "5": 1}})
    assert (await read("margin(2)", attempt)) == Reading("margin(2)", 2.0, 2.0, True)
    assert not (await read("margin(3)", attempt)).sure
    lone = Attempt(text="4", answer="4", metadata={"votes": {"4": 1}})
    assert (await read("margin(1)", lone)).sure
    unvoted = await read("margin(1)", Attempt(text="4", answer="4"))
    assert (unvoted.sure, unvoted.value, unvoted.why) == (False, None, "no vote")


async def test_confidence_is_measured_in_the_signals_view():
    signal = build_signal("confidence(1.5)")
    # every word: its own logprob 0, one alternative at -4 -> token confidence 2.0
    backend = ScriptedBackend([(r".*", "The answer is 4.")], watch=True,
                              tops=lambda text, i: [[0.0, -4.0]] * len(text.split()))
    c = ctx(backend)
    view = signal.view(c)
    attempt = await CoT().solve(task(), view)
    reading = await signal.read(task(), attempt, view)
    assert (reading.value, reading.sure) == (2.0, True)
    assert not (await read("confidence(2.5)", attempt, view)).sure
    voted = await build("sc(cot, n=2)").solve(task(), view)  # read off the trace
    assert (await read("confidence(1.5)", voted, view)).value == 2.0


async def test_confidence_is_unsure_when_nothing_was_measured():
    reading = await read("confidence(1.0)", Attempt(text="4", answer="4"))
    assert (reading.sure, reading.why) == (False, "not measured (no logprobs)")


CODE_TASK = Task.from_prompt("add", metadata={
    "prompt": "def add(a, b):\n", "entry_point": "add",
    "tests": "def check(f):\n    assert f(2, 3) == 5\n"}, verifier="code")


async def test_verified_runs_the_tasks_label_free_check():
    right = Attempt(text="    return a + b\n")
    wrong = Attempt(text="    return a - b\n")
    assert (await read("verified", right, on=CODE_TASK)).sure
    assert (await read("verified", wrong, on=CODE_TASK)) == Reading(
        "verified", False, None, False)
    untested = CODE_TASK.model_copy(update={"metadata": {}})
    reading = await read("verified", right, on=untested)
    assert not reading.sure and reading.why.startswith("code: the code verifier needs")


async def test_verified_reads_self_debugs_examples():
    passed = Attempt(text="", metadata={"examples": 3, "examples_passed": 3})
    failed = Attempt(text="", metadata={"examples": 3, "examples_passed": 2})
    assert (await read("verified", passed)).sure and not (await read("verified", failed)).sure
    nothing = await read("verified", Attempt(text="4"))
    assert (nothing.sure, nothing.why) == (False, "nothing to check against")


async def test_score_reads_the_attempts_score():
    assert (await read("score(0.5)", Attempt(text="4", score=0.75))).sure
    assert not (await read("score(0.8)", Attempt(text="4", score=0.75))).sure
    assert (await read("score(0.5)", Attempt(text="4"))).why == "not scored"


def test_reading_text_names_value_and_threshold():
    assert Reading("margin(2)", 1.0, 2.0, False).text() == "margin(2): 1 (needs >= 2)"
    assert Reading("ran", None, None, False, "no run").text() == "ran: no run (needs True)"


@pytest.mark.parametrize(("until", "message"), [
    ("bogus", "unknown signal 'bogus'; known: ran, margin, confidence, verified, score"),
    ("margin", "margin needs a number: margin(k)"),
    ("margin(0)", "margin(k) needs k >= 1, got 0"),
    ("ran(1)", "ran takes no number (write ran)"),
    ("score('high')", "score takes one number at most, e.g. score(2); got \"score('high')\""),
    ("margin(k=2)", "a signal is a name or a name with one number, e.g. margin(2); "
                    "got 'margin(k=2)'"),
])
def test_a_bad_signal_is_a_spec_error_naming_the_signals(until, message):
    with pytest.raises(SpecError) as err:
        build(f"cascade(cot, cot, until={until!r})")
    assert err.value.message.startswith(
        "bad parameter for cascade: until expects str (registered: confidence, margin, ran, "
        "score, verified)")
    assert err.value.message.endswith(message)


def test_every_signal_is_registered_by_its_name():
    assert list(SIGNALS) == ["ran", "margin", "confidence", "verified", "score"]
    assert all(name == cls.name for name, cls in SIGNALS.items())
