"""CUSUM loop detector: constructed streams, GSM8K gold solutions, the labelled set."""

from __future__ import annotations

import functools
import importlib.util
import json
import random
import re
from pathlib import Path

import pytest

from refinery.engine.loops import CusumLoopDetector, LoopAlarm
from refinery.engine.stops import Stop
from refinery.eval.datasets import gsm8k_file

ROOT = Path(__file__).resolve().parents[2]
# The labelled set at two generation caps (512 and 1024 new tokens), same prompts,
# and the fresh test set (1024 cap, other prompts) that no choice was made on.
SETS = [("loops", "heldout"), ("loops-1024", "heldout"), ("loops-test", "test")]
GSM8K_TEST = gsm8k_file("test")

DET = CusumLoopDetector()

CLEAN = (
    "Janet's ducks lay 16 eggs per day. She eats 3 for breakfast and bakes muffins "
    "with 4, so she uses 3 + 4 = 7 eggs.\nThat leaves 16 - 7 = 9 eggs to sell.\n"
    "She sells each egg for $2, so she makes 9 * 2 = $18 every day.\n"
    "Now, we need to find out how much she makes in a week.\n"
    "A week has 7 days, so she makes 18 * 7 = $126 in a week.\n"
    "Now, we need to find out how much she makes in a month of 30 days.\n"
    "She makes 18 * 30 = $540 in a month.\nThe answer is 540."
)
INTRO = "To solve this, we need the cost of the shirts and the cost of the pants.\n\n"
STATEMENT = (
    "Now, we need to find the total cost of the shirts. We can do this by multiplying "
    "the number of shirts by the price of one shirt, which gives us 3 * 12 = 36.\n\n"
)
FRUITS = ("apples pears plums cherries grapes lemons limes mangoes melons kiwis figs dates "
          "peaches apricots oranges bananas berries coconuts guavas papayas quinces olives "
          "raisins prunes currants nectarines tangerines pomelos lychees persimmons").split()


def feed_all(text: str, det: CusumLoopDetector = DET,
             sizes: tuple[int, ...] = ()) -> LoopAlarm | None:
    """Feed ``text`` in chunks of the given sizes (cycled), or whole if none; the alarm."""
    mon = det.start()
    if not sizes:
        mon.feed(text)
        return mon.alarm
    pos, i = 0, 0
    while pos < len(text):
        if mon.feed(text[pos : pos + sizes[i % len(sizes)]]) is not None:
            return mon.alarm
        pos += sizes[i % len(sizes)]
        i += 1
    return None


def test_clean_solution_does_not_alarm():
    assert feed_all(CLEAN) is None
    assert feed_all(CLEAN, sizes=(1,)) is None


def test_statement_loop_alarms_and_onset_is_the_second_copy():
    text = INTRO + STATEMENT * 8
    alarm = feed_all(text)
    assert alarm is not None
    second = len(INTRO) + len(STATEMENT)
    # The cut keeps the first copy whole and no second one (up to the separator).
    assert second - 2 <= alarm.onset <= second
    assert text[: alarm.onset].rstrip() == (INTRO + STATEMENT).rstrip()
    # Detected within about two copies, long before the end of the stream.
    assert alarm.position < len(INTRO) + 3 * len(STATEMENT)


def test_numerical_loop_without_punctuation_alarms():
    head = "Remaining amount = Interest / Interest rate ="
    text = head + " $20 * 10% =" * 60
    alarm = feed_all(text, sizes=(3, 1, 4))
    assert alarm is not None
    # The loop starts with the second "$20 * 10% =" (the first is the computation).
    first = len(head) + len(" $20 * 10% =")
    assert abs(alarm.onset - first) <= len(" $20 * 10% =")
    assert alarm.position < len(head) + 12 * len(" $20 * 10% =")


def test_loop_that_counts_while_it_repeats_alarms():
    intro = "First we find the allowance. Jayden's camera costs $200.\n\n"
    body = "".join(f"Step {i}: Calculate Jayden's camera's allowance.\n"
                   f"Jayden's camera's allowance is ${i * 100}.\n\n" for i in range(3, 30))
    alarm = feed_all(intro + body)
    assert alarm is not None
    assert (intro + body)[alarm.onset :].lstrip().startswith(("Step 4", "Jayden's camera's"))


@pytest.mark.parametrize("text", [
    "\n".join(f"{i}. {f}" for i, f in enumerate(FRUITS, 1)),
    "The multiples of 7 are " + ", ".join(str(7 * i) for i in range(1, 150)) + ".",
    "\n".join(f"Day {i}: {3 * i + 2} apples" for i in range(1, 80)),
    " ".join(f"Then {a} is {i + 3} times the {b} count." for i, (a, b) in
             enumerate(zip(FRUITS, FRUITS[3:] + FRUITS[:3], strict=True))),
])
def test_long_non_repeating_lists_do_not_alarm(text):
    assert feed_all(text) is None
    assert feed_all(text, sizes=(2, 5)) is None


def test_chunking_does_not_change_the_alarm():
    text = CLEAN + "\n\n" + STATEMENT * 6
    whole = feed_all(text)
    assert whole is not None
    assert feed_all(text, sizes=(1,)) == whole
    rng = random.Random(0)
    assert feed_all(text, sizes=tuple(rng.randint(1, 9) for _ in range(50))) == whole
    # A stream cut right after a number's first digits or a sentence's full stop.
    assert feed_all(text, sizes=(7, 2, 1, 13)) == whole


def test_alarm_is_sticky_and_monitors_are_independent():
    mon = DET.start()
    stop = mon.feed(INTRO + STATEMENT * 8)
    assert stop == Stop("loop", keep=mon.alarm.onset)
    assert mon.feed("anything else") == stop and mon.measures() is None
    assert DET.start().feed(CLEAN) is None


def test_parameters_are_validated():
    with pytest.raises(ValueError):
        CusumLoopDetector(ngram=1)
    with pytest.raises(ValueError):
        CusumLoopDetector(h=0)
    with pytest.raises(ValueError):
        CusumLoopDetector(word_share=1.5)


def test_word_share_decides_whether_a_loop_that_counts_in_formulas_counts():
    # The model's counting loop from data/loops-1024 (gsm8k-1277): under half of each
    # line's units are words, so only a lower word share sees the masked repeat.
    lines = [f"Mia's age is {a} + 40 = {a + 40} years old.\n" for a in range(80, 2000, 40)]
    text = "We need Mia's age and Emma's age.\n" + "".join(lines)
    assert feed_all(text) is None
    low = feed_all(text, CusumLoopDetector(word_share=0.34))
    assert low is not None
    assert text[low.onset :].startswith("Mia's age is")


def _gold() -> list[str]:
    if not GSM8K_TEST.exists():
        pytest.skip("GSM8K test split not available")
    answers = [json.loads(line)["answer"] for line in GSM8K_TEST.open()]
    return answers + [re.sub(r"<<[^>]*>>", "", a) for a in answers]


def test_no_gsm8k_gold_solution_alarms():
    chunks = re.compile(r"\s*\S+|\s+")  # word-sized pieces, like model tokens
    alarms = []
    for i, text in enumerate(_gold()):
        mon = DET.start()
        if any(mon.feed(c) is not None for c in chunks.findall(text)):
            alarms.append(i)
    assert len(_gold()) == 2 * 1319
    assert alarms == []


def _heldout(labelled: str = "loops", split: str = "heldout") -> list[dict]:
    return [json.loads(line) for line in (ROOT / "data" / labelled / f"{split}.jsonl").open()]


def _stream_tokens(row: dict) -> tuple[LoopAlarm | None, int]:
    """Feed one model token at a time, as the backend does; return alarm and tokens fed."""
    mon, pos = DET.start(), 0
    for i, n in enumerate(row["token_lens"], 1):
        stop = mon.feed(row["text"][pos : pos + n])
        pos += n
        if stop is not None:
            return mon.alarm, i
    return None, len(row["token_lens"])


@functools.cache  # each set streamed once, shared by the tests below
def _figures(labelled: str, split: str = "heldout") -> dict[str, float]:
    tp = fp = fn = saved = looping_tokens = 0
    delays = []
    for r in _heldout(labelled, split):
        alarm, fed = _stream_tokens(r)
        tp += bool(alarm) and r["label"]
        fp += bool(alarm) and not r["label"]
        fn += not alarm and r["label"]
        if r["label"]:
            looping_tokens += r["n_tokens"]
        if alarm and r["label"]:
            delays.append(fed - 1 - r["onset_token"])
            saved += r["n_tokens"] - fed
    assert tp + fn >= 50  # enough looping generations for the figures to mean something
    return {"precision": tp / (tp + fp), "recall": tp / (tp + fn),
            "delay": sum(delays) / len(delays), "saved": saved / looping_tokens}


@pytest.mark.parametrize(("labelled", "split"), SETS)
def test_heldout_precision_and_recall_meet_the_targets(labelled, split):
    f = _figures(labelled, split)
    assert f["precision"] >= 0.95
    assert f["recall"] >= 0.9
    # Measured +90 tokens: the label itself needs a 64-token repeat.
    assert f["delay"] <= 100


def test_tokens_saved_depend_on_the_cap_and_meet_the_target_at_1024():
    # A loop starts near token 200 on average; what runs after the alarm up to the cap
    # is saved. At 512 the label's own 64-token evidence bounds the saving at 46%
    # (measured 39.6%); at 1024 an unwatched loop runs twice as long.
    at512, at1024 = _figures("loops")["saved"], _figures("loops-1024")["saved"]
    assert 0.35 <= at512 < 0.5
    assert at1024 >= 0.5
    # The fresh test set (measured 65.6%).
    assert _figures("loops-test", "test")["saved"] >= 0.5


def test_real_generations_alarm_alike_streamed_or_whole():
    for r in _heldout()[:200]:
        streamed, _ = _stream_tokens(r)
        assert feed_all(r["text"]) == streamed, r["id"]


def _labeller():
    spec = importlib.util.spec_from_file_location(
        "make_loop_set", ROOT / "scripts" / "make_loop_set.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_labelling_rule():
    lab = _labeller()
    # A verbatim repeat of n tokens; the onset is the second copy's first token.
    assert lab.repeat_onset(list("xyzabcdefabcdef"), n=6) == (9, 3)
    assert lab.repeat_onset(list("abcdefghij"), n=3) is None
    # Numbers are masked (and a number split in digit tokens is one unit) ...
    step = lambda i: ["Step", " ", *str(i), ":", " add", " the", " costs", ".\n"]  # noqa: E731
    tokens = [t for i in (9, 10, 11, 12) for t in step(i)]
    assert lab.repeat_onset(tokens, n=12) == (len(step(9)), 0)
    # ... but a list of different numbers is not a loop.
    nums = [t for i in range(1, 60) for t in (" ", *str(7 * i), ",")]
    assert lab.repeat_onset(nums, n=12) is None

