"""An LLM rubric judge: a model grades an answer on a numeric scale, over any Backend.

Judges answer in many shapes ("Score: 7/10", "**8**", ``{"score": 6}``,
"I'd give it a 7 out of 10"); :func:`parse_score` reads all of them and says
how it did. An unreadable reply gives a neutral score and never a pass.

Example:
    >>> parse_score("Clear and correct. Score: 8/10").value
    8.0
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from refinery.engine.backends.base import Backend
from refinery.engine.constraints import Constraint, structured_mode
from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Message, SamplingParams, Task
from refinery.verifiers.base import Verdict

__all__ = ["DEFAULT_RUBRIC", "EXPLAIN_CHARS", "JudgeVerifier", "ParsedScore", "grade_pattern",
           "parse_score", "score_form"]

DEFAULT_RUBRIC = (
    "Grade the response to the question for correctness first, then completeness and "
    "clarity. A response with a wrong final answer cannot score above the middle of the scale."
)

_NUM = r"(-?\d+(?:\.\d+)?)"
_OUT_OF = rf"(?:\s*(?:/|out\s+of)\s*{_NUM})?"
_LABELED = re.compile(
    rf"(?:score|rating|grade)\**\s*(?:is|of|=|:)?\s*[:=]?\s*\**\s*{_NUM}\s*\**{_OUT_OF}",
    re.IGNORECASE,
)
_BOLD = re.compile(rf"\*\*\s*{_NUM}{_OUT_OF}\s*\*\*")
_FRACTION = re.compile(rf"{_NUM}\s*(?:/|out\s+of)\s*{_NUM}", re.IGNORECASE)
_ANY_NUM = re.compile(_NUM)
_JSON_OBJ = re.compile(r"\{[^{}]*\}")
# Characters of explanation a structured grade reply may write before its score line.
EXPLAIN_CHARS = 600


@dataclass(frozen=True)
class ParsedScore:
    """A score read from a judge's reply: ``value`` on the judge's scale (None if
    unreadable) and ``how`` it was found (json, labeled, bold, fraction, last-number)."""

    value: float | None
    how: str


def _on_scale(v: float, denom: str | None, lo: float, hi: float) -> float | None:
    if denom is not None:
        d = float(denom)
        if d <= 0:
            return None
        if d != hi:  # "4/5" on a 10-point scale is an 8
            v = v / d * hi
    return v if lo <= v <= hi else None


def parse_score(text: str, lo: float = 1, hi: float = 10) -> ParsedScore:
    """Read a numeric grade in ``[lo, hi]`` from a judge's reply.

    Tried in order, each taking the last hit in range: a JSON object with
    ``score``/``rating``/``grade``; a labelled score (``Score: 7/10``,
    ``rating = 6``, ``Grade: **8**``); a bold number (``**8**``); a fraction
    over the scale (``7/10``, ``7 out of 10``); the last number in range.

    Example:
        >>> parse_score('{"score": 4, "reason": "ok"}', 0, 5)
        ParsedScore(value=4.0, how='json')
        >>> parse_score("no idea").value is None
        True
    """
    for m in reversed(_JSON_OBJ.findall(text)):
        try:
            obj = json.loads(m)
        except ValueError:
            continue
        if isinstance(obj, dict):
            for key in ("score", "rating", "grade"):
                raw = obj.get(key)
                if isinstance(raw, (int, float)) and not isinstance(raw, bool):
                    v = _on_scale(float(raw), None, lo, hi)
                    if v is not None:
                        return ParsedScore(v, "json")
                if isinstance(raw, str):
                    sub = parse_score(raw, lo, hi)
                    if sub.value is not None:
                        return ParsedScore(sub.value, "json")
    for rx, how in ((_LABELED, "labeled"), (_BOLD, "bold")):
        for m in reversed(list(rx.finditer(text))):
            v = _on_scale(float(m.group(1)), m.group(2), lo, hi)
            if v is not None:
                return ParsedScore(v, how)
    for m in reversed(list(_FRACTION.finditer(text))):
        if float(m.group(2)) == hi:
            v = _on_scale(float(m.group(1)), None, lo, hi)
            if v is not None:
                return ParsedScore(v, "fraction")
    for m in reversed(list(_ANY_NUM.finditer(text))):
        v = _on_scale(float(m.group(1)), None, lo, hi)
        if v is not None:
            return ParsedScore(v, "last-number")
    return ParsedScore(None, "unparsed")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def grade_pattern(lo: float, hi: float) -> str:
    """A regex of one grade in ``[lo, hi]``: the integers, highest first, on an
    integral scale; otherwise any short decimal (:func:`parse_score` checks the range)."""
    if float(lo).is_integer() and float(hi).is_integer():
        return "(?:" + "|".join(str(i) for i in range(int(hi), int(lo) - 1, -1)) + ")"
    return r"-?\d{1,3}(?:\.\d{1,3})?"


def score_form(lo: float, hi: float, *, out_of: bool = False,
               explain: int = EXPLAIN_CHARS) -> str:
    """The regex a structured grade reply matches: a one-paragraph explanation, then a
    last line ``Score: N`` (``Score: N/hi`` with ``out_of``).

    The explanation (1 to ``explain`` characters) holds no line break, so the first
    line break commits the reply to its score line: the regex is deterministic (no
    ambiguity for a grammar engine to track) and bounds the reply, since every
    token writes at least one character. :func:`parse_score` reads the result as
    ``labeled``.

    Example:
        >>> import re
        >>> bool(re.fullmatch(score_form(0, 5), "The sum is right.\\nScore: 5"))
        True
    """
    tail = f"Score: {grade_pattern(lo, hi)}" + (f"/{re.escape(_num(hi))}" if out_of else "")
    return rf"[^\n]{{1,{explain}}}\n{tail}"


class JudgeVerifier:
    """Asks a model to grade an answer against a rubric; passes at ``threshold``.

    ``scale`` is the judge's range (``(1, 10)`` or ``(0, 5)``...); the Verdict's
    ``score`` maps it onto [0, 1]. With ``samples > 1`` the grades of several
    samples are averaged (unreadable ones are skipped). An entirely unreadable
    reply gives the neutral score 0.5, ``passed=False`` and a detail saying so.

    ``structured`` is decided once, here, by
    :func:`~refinery.engine.constraints.structured_mode`: ``None`` constrains the
    reply to :func:`score_form` (a one-paragraph explanation, then ``Score: N/hi``)
    when the backend enforces regexes, ``False`` keeps free text, ``True`` requires
    the constraint (an error on a backend without regexes). The detail's
    ``parsed`` says which samples held a readable score, ``structured`` which path ran.
    Backend errors propagate: a judge that could not be asked is no verdict.

    Example:
        >>> class Fixed:
        ...     async def generate(self, messages, params, *, n=None, stop_rule=None):
        ...         from refinery.engine.types import Completion
        ...         return [Completion(text="Good. Score: 9/10", prompt_tokens=1,
        ...                            completion_tokens=5, finish_reason="stop")]
        >>> import asyncio
        >>> v = JudgeVerifier(Fixed(), threshold=7)
        >>> asyncio.run(v.verify(Task.from_prompt("Why is the sky blue?"), "Rayleigh...")).passed
        True
    """

    name = "judge"

    def __init__(self, backend: Backend, rubric: str = DEFAULT_RUBRIC, threshold: float = 7.0, *,
                 scale: tuple[float, float] = (1, 10), samples: int = 1,
                 params: SamplingParams | None = None,
                 structured: bool | None = None) -> None:
        lo, hi = scale
        if not lo < hi:
            raise InvalidRequestError(f"judge scale must be (low, high), got {scale!r}")
        if not lo <= threshold <= hi:
            raise InvalidRequestError(f"judge threshold {threshold} is outside the scale {scale}")
        if samples < 1:
            raise InvalidRequestError("judge samples must be >= 1")
        self.backend = backend
        self.rubric = rubric
        self.threshold = threshold
        self.scale = (float(lo), float(hi))
        self.samples = samples
        self.params = params or SamplingParams(temperature=0.0 if samples == 1 else 0.7,
                                               max_tokens=512)
        self.structured = structured_mode("judge", structured, frozenset({"regex"}), backend)
        if self.structured:
            form = Constraint.from_regex(score_form(lo, hi, out_of=True))
            self.params = self.params.but(constraint=form)

    def messages(self, task: Task, answer: str, gold: str | None = None) -> list[Message]:
        """The judge prompt: rubric and output format as system, the case as user."""
        lo, hi = (int(x) if x.is_integer() else x for x in self.scale)
        system = (
            f"You are a strict, fair grader.\n\nRubric: {self.rubric}\n\n"
            f"Explain your judgement briefly, then end with a line of the form "
            f"'Score: N/{hi}' where N is a number from {lo} to {hi}."
        )
        parts = [f"Question:\n{task.question}"]
        if gold is not None:
            parts.append(f"Reference answer:\n{gold}")
        parts.append(f"Response to grade:\n{answer}")
        return [Message(role="system", content=system),
                Message(role="user", content="\n\n".join(parts))]

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        lo, hi = self.scale
        completions = await self.backend.generate(self.messages(task, answer, gold), self.params,
                                                  n=self.samples)
        parsed = [parse_score(c.text, lo, hi) for c in completions]
        values = [p.value for p in parsed if p.value is not None]
        detail: dict = {
            "scores": [p.value for p in parsed],
            "parsed_by": [p.how for p in parsed],
            "parsed": [p.value is not None for p in parsed],
            "structured": self.structured,
            "scale": [lo, hi],
            "threshold": self.threshold,
            "explanation": completions[0].text.strip()[-2000:] if completions else "",
        }
        if not values:
            detail["reason"] = "judge reply had no readable score; neutral score given"
            return Verdict(passed=False, score=0.5, detail=detail)
        mean = sum(values) / len(values)
        detail["mean"] = mean
        return Verdict(passed=mean >= self.threshold, score=(mean - lo) / (hi - lo), detail=detail)
