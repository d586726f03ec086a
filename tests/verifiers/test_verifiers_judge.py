"""The LLM judge: score parsing and control flow over a scripted fake backend."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pytest

from refinery.engine.constraints import StructuredModeError
from refinery.engine.errors import BackendError, InvalidRequestError
from refinery.engine.types import Completion, Message, SamplingParams, Task
from refinery.verifiers.judge import JudgeVerifier, grade_pattern, parse_score, score_form


class ScriptedBackend:
    """Returns canned replies in order and records every call (a test double)."""

    model = "scripted"
    max_model_len = 4096

    def __init__(self, replies: list[str | Exception]) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[Message], SamplingParams, int]] = []

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None, stop_rule: object = None) -> list[Completion]:
        n = n or params.n
        self.calls.append((list(messages), params, n))
        out = []
        for _ in range(n):
            reply = self.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            out.append(Completion(text=reply, prompt_tokens=10, completion_tokens=5,
                                  finish_reason="stop"))
        return out

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return 10

    async def aclose(self) -> None:
        pass


PARSE_10 = [
    ("The answer is right. Score: 7/10", 7.0, "labeled"),
    ("Score: 7", 7.0, "labeled"),
    ("score = 6", 6.0, "labeled"),
    ("Rating: **8**/10", 8.0, "labeled"),
    ("Final score: 9.5 out of 10", 9.5, "labeled"),
    ("It is decent.\n\n**8**", 8.0, "bold"),
    ('{"score": 4, "explanation": "weak"}', 4.0, "json"),
    ('```json\n{"explanation": "good", "score": "9/10"}\n```', 9.0, "json"),
    ("I would give it 6/10 overall.", 6.0, "fraction"),
    ("Three steps, all correct, so 9.", 9.0, "last-number"),
    ("Score: 4/5", 8.0, "labeled"),  # rescaled onto 1-10
    ("Score: 42. Hmm, that is too high; I mean 7", 7.0, "last-number"),  # 42 out of range
    ("Step 1 was fine; Score: 3/10; later I say 2 but the score: 5", 5.0, "labeled"),
]


@pytest.mark.parametrize(("text", "value", "how"), PARSE_10)
def test_parse_score_on_a_ten_point_scale(text: str, value: float, how: str) -> None:
    got = parse_score(text, 1, 10)
    assert (got.value, got.how) == (value, how)


def test_parse_score_other_scales_and_failures() -> None:
    assert parse_score("Score: 0/5", 0, 5).value == 0.0
    assert parse_score("**5**", 0, 5).value == 5.0
    assert parse_score("Score: 6", 0, 5).value is None  # out of range, nothing else
    unread = parse_score("I cannot grade this.", 1, 10)
    assert unread.value is None and unread.how == "unparsed"
    assert parse_score("", 1, 10).value is None
    assert parse_score('{"score": true}', 1, 10).value is None


async def test_judge_passes_at_threshold_and_prompts_with_rubric_and_reference() -> None:
    backend = ScriptedBackend(["Correct and clear. Score: 8/10", "Wrong result. Score: 3/10"])
    judge = JudgeVerifier(backend, rubric="Be harsh on arithmetic.", threshold=7)
    task = Task.from_prompt("What is 2+2?")
    good = await judge.verify(task, "4", gold="4")
    assert good.passed and good.score == pytest.approx((8 - 1) / 9)
    assert good.detail["scores"] == [8.0] and good.detail["parsed_by"] == ["labeled"]
    assert "Correct and clear" in good.detail["explanation"]
    bad = await judge.verify(task, "5")
    assert not bad.passed and bad.score == pytest.approx((3 - 1) / 9)
    messages, params, n = backend.calls[0]
    assert messages[0].role == "system" and "Be harsh on arithmetic." in messages[0].content
    assert "Score: N/10" in messages[0].content
    assert "What is 2+2?" in messages[1].content and "Reference answer:\n4" in messages[1].content
    assert params.temperature == 0.0 and n == 1
    assert "Reference answer" not in backend.calls[1][0][1].content


async def test_judge_unparseable_reply_is_neutral_and_says_so() -> None:
    judge = JudgeVerifier(ScriptedBackend(["I refuse to grade."]), threshold=5)
    v = await judge.verify(Task.from_prompt("q"), "a")
    assert not v.passed and v.score == 0.5
    assert "no readable score" in v.detail["reason"]


async def test_judge_averages_samples_and_skips_unreadable_ones() -> None:
    backend = ScriptedBackend(["Score: 8", "no idea", "**6**"])
    judge = JudgeVerifier(backend, threshold=7, samples=3)
    v = await judge.verify(Task.from_prompt("q"), "a")
    assert v.detail["scores"] == [8.0, None, 6.0] and v.detail["mean"] == 7.0
    assert v.passed  # 7.0 >= 7
    assert backend.calls[0][2] == 3 and backend.calls[0][1].temperature > 0


async def test_judge_on_a_zero_to_five_scale() -> None:
    judge = JudgeVerifier(ScriptedBackend(["Score: 4/5"]), threshold=3, scale=(0, 5))
    v = await judge.verify(Task.from_prompt("q"), "a")
    assert v.passed and v.score == pytest.approx(0.8)
    assert "Score: N/5" in judge.messages(Task.from_prompt("q"), "a")[0].content


async def test_judge_backend_errors_propagate() -> None:
    judge = JudgeVerifier(ScriptedBackend([BackendError("upstream down")]))
    with pytest.raises(BackendError):
        await judge.verify(Task.from_prompt("q"), "a")


def test_judge_rejects_bad_settings() -> None:
    b = ScriptedBackend([])
    with pytest.raises(InvalidRequestError):
        JudgeVerifier(b, threshold=11)
    with pytest.raises(InvalidRequestError):
        JudgeVerifier(b, scale=(5, 1))
    with pytest.raises(InvalidRequestError):
        JudgeVerifier(b, samples=0)


# --------------------------------------------------------------- structured steps


class StructuredBackend(ScriptedBackend):
    """The double above, declaring the constraint kinds it enforces."""

    def __init__(self, replies: list[str | Exception],
                 kinds: frozenset[str] = frozenset({"regex"})) -> None:
        super().__init__(replies)
        self.structured_outputs = kinds


def test_score_form_is_one_paragraph_then_the_score_line() -> None:
    form = score_form(1, 10, out_of=True)
    assert re.fullmatch(form, "Right answer, clear steps.\nScore: 8/10")
    assert re.fullmatch(form, "Wrong.\nScore: 10/10")
    assert not re.fullmatch(form, "Wrong.\nScore: 11/10")
    assert not re.fullmatch(form, "Wrong.\nScore: 0/10")
    assert not re.fullmatch(form, "Two\nparagraphs.\nScore: 8/10")
    assert not re.fullmatch(form, "x" * 601 + "\nScore: 8/10")
    assert re.fullmatch(score_form(0, 5), "ok\nScore: 0")
    assert grade_pattern(0, 5) == "(?:5|4|3|2|1|0)"
    assert re.fullmatch(score_form(0, 2.5, out_of=True), "ok\nScore: 1.5/2.5")


async def test_structured_judge_constrains_the_reply_and_notes_parsing() -> None:
    backend = StructuredBackend(["Correct and clear.\nScore: 8/10"])
    judge = JudgeVerifier(backend, threshold=7)
    v = await judge.verify(Task.from_prompt("What is 2+2?"), "4")
    [(_, params, _)] = backend.calls
    assert params.constraint.kind == "regex"
    assert params.constraint.regex == score_form(1, 10, out_of=True)
    assert params.constraint.accepts("Correct and clear.\nScore: 8/10")
    assert v.passed and v.detail["scores"] == [8.0]
    assert v.detail["parsed"] == [True] and v.detail["structured"] is True


async def test_judge_structured_false_and_unsupported_default_are_free_text() -> None:
    off = StructuredBackend(["no idea"])
    v = await JudgeVerifier(off, structured=False).verify(Task.from_prompt("q"), "a")
    assert off.calls[0][1].constraint is None
    assert v.detail["parsed"] == [False] and v.detail["structured"] is False
    bare = StructuredBackend(["Score: 7"], kinds=frozenset({"json"}))
    v = await JudgeVerifier(bare).verify(Task.from_prompt("q"), "a")
    assert bare.calls[0][1].constraint is None and v.detail["structured"] is False
    assert v.detail["scores"] == [7.0]
    # a backend that declares nothing supports nothing
    plain = ScriptedBackend(["Score: 7"])
    assert JudgeVerifier(plain).structured is False


def test_judge_structured_true_without_regexes_is_refused() -> None:
    with pytest.raises(StructuredModeError, match=r"judge\(structured=True\) needs 'regex'"):
        JudgeVerifier(StructuredBackend([], kinds=frozenset({"json"})), structured=True)
