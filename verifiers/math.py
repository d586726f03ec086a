"""Math answers: extraction, normalisation, equivalence, and the math / GSM8K verifiers.

Three layers, cheapest first, because most checks (every GSM8K one) are settled
by the first:

1. :func:`normalize_answer` turns an answer into a canonical string (commas,
   ``$``, units, ``\\text{}``, ``%``, degrees, ``x =`` dropped; every rational
   number printed one way, so ``\\frac{1}{2}``, ``1/2`` and ``0.50`` all become
   ``0.5``). Voting strategies group answers by this key.
2. Exact rational / float comparison of numbers.
3. Symbolic equivalence with math-verify (on sympy), plus a plain sympy
   fallback, in a separate worker process with a hard wall-clock timeout: sympy
   can spend minutes (or all memory) on a pathological expression, and
   math-verify's own timeout uses ``signal.alarm``, which only works in the
   main thread and cannot interrupt C code. A stuck worker is killed and
   replaced; the caller gets ``False``.

Example:
    >>> extract_answer("so the total is \\\\boxed{\\\\frac{1}{2}}.")
    '\\\\frac{1}{2}'
    >>> normalize_answer("$1,000.")
    '1000'
    >>> is_equivalent("\\\\frac{1}{2}", "0.5")
    True
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from fractions import Fraction
from typing import Literal

from refinery.engine.errors import InvalidRequestError
from refinery.engine.tool_calls import KEY_PREFIX, turn_key
from refinery.engine.types import Task
from refinery.verifiers.base import Verdict
from refinery.verifiers.symbolic_workers import symbolic_compare

log = logging.getLogger(__name__)

__all__ = [
    "GSM8KVerifier",
    "MathVerifier",
    "extract_answer",
    "extract_boxed",
    "extract_gsm8k_flexible",
    "extract_gsm8k_strict",
    "format_rational",
    "gsm8k_normalize",
    "is_equivalent",
    "normalize_answer",
    "parse_rational",
]

# ----------------------------------------------------------------------------- extraction

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(
    r"\b(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*:?\s*([^\n]+)", re.IGNORECASE
)
_NUMBER_LIKE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")

# lm-evaluation-harness gsm8k filters, verbatim (tasks/gsm8k/gsm8k*.yaml).
_GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_GSM8K_COT_STRICT = re.compile(r"The answer is (\-?[0-9\.\,]+).")
_GSM8K_IGNORE = [re.compile(p) for p in (r",", r"\$", r"(?s).*#### ", r"\.$")]


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces respected.

    Also accepts the brace-less ``\\boxed 5`` form. ``None`` when there is none
    or its braces never close.

    Example:
        >>> extract_boxed(r"x = \\boxed{\\frac{a}{b^{2}}}")
        '\\\\frac{a}{b^{2}}'
    """
    starts = [m for m in re.finditer(r"\\(?:boxed|fbox)\s*", text)]
    for m in reversed(starts):
        i = m.end()
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                c = text[j]
                if c == "{" and text[j - 1] != "\\":
                    depth += 1
                elif c == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j].strip()
            continue  # unbalanced: try an earlier box
        rest = re.match(r"([^\s$]+)", text[i:])
        if rest:
            return rest.group(1).strip()
    return None


def _regex_filter(text: str, regex: re.Pattern[str], group_select: int) -> str | None:
    # lm-eval's RegexFilter: findall, pick one match, first non-empty group, strip.
    found = regex.findall(text)
    if not found:
        return None
    match = found[group_select]
    if isinstance(match, tuple):
        nonempty = [g for g in match if g]
        if not nonempty:
            return None
        match = nonempty[0]
    return match.strip()


def extract_gsm8k_strict(text: str, *, cot: bool = False) -> str | None:
    """lm-evaluation-harness GSM8K ``strict-match``: first ``#### (-?[0-9.,]+)``.

    With ``cot=True`` the gsm8k-cot variant: first ``The answer is (-?[0-9.,]+).``
    (the final ``.`` is the harness's, any character). ``None`` where the
    harness would say ``[invalid]``. Compare results with :func:`gsm8k_normalize`.

    Example:
        >>> extract_gsm8k_strict("3 + 4 = 7\\n#### 7")
        '7'
    """
    return _regex_filter(text, _GSM8K_COT_STRICT if cot else _GSM8K_STRICT, 0)


def extract_gsm8k_flexible(text: str) -> str | None:
    """lm-evaluation-harness GSM8K ``flexible-extract``: last ``(-?[$0-9.,]{2,})|(-?[0-9]+)``.

    Example:
        >>> extract_gsm8k_flexible("She pays $1,200. Then 3 more.")
        '3'
    """
    return _regex_filter(text, _NUMBER_LIKE, -1)


def gsm8k_normalize(s: str) -> str:
    """The harness's comparison form: drop commas, ``$``, everything up to ``#### ``,
    a trailing ``.``; lower-case.

    Example:
        >>> gsm8k_normalize("$1,000.")
        '1000'
    """
    s = s.strip()
    for rx in _GSM8K_IGNORE:
        s = rx.sub("", s)
    return s.lower().strip()


def _unwrap_math(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("\\(", "\\)"), ("\\[", "\\]"), ("$", "$")):
        if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def _is_bare(s: str) -> bool:
    # A lone answer ("\frac{1}{2}", "18 dollars", "x = 5", "(C)") rather than
    # prose ("She makes 18"): one short line, and no word before its first digit.
    if "\n" in s or len(s) > 80 or not s:
        return False
    words = list(re.finditer(r"(?<![\\A-Za-z])[A-Za-z]{2,}", s))
    if not words:
        return True
    first_digit = re.search(r"\d", s)
    if first_digit is None:
        return len(words) <= 3
    return len(words) <= 2 and words[0].start() > first_digit.start()


def extract_answer(text: str) -> str | None:
    """The final answer in a solution, or ``None``.

    A tool-call answer's answer is its calls' canonical key
    (:func:`~refinery.engine.tool_calls.turn_key`), so votes count equal calls as one.
    Otherwise tried in order: the last ``<answer>...</answer>``; the last ``\\boxed{}``
    (nested braces); the last ``#### n``; the last "The answer is X"; the whole
    text when it is itself a bare answer; the last number (GSM8K
    flexible-extract, restricted to matches that contain a digit).

    Example:
        >>> extract_answer("<answer>42</answer>")
        '42'
        >>> extract_answer("Each costs 3, so 4 cost 12 dollars in total.")
        '12'
    """
    if not text:
        return None
    if (call := turn_key(text)) is not None:
        return call
    tags = _ANSWER_TAG.findall(text)
    if tags:
        inner = tags[-1].strip()
        return extract_boxed(inner) or _unwrap_math(inner)
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(text)
    if hashes:
        return hashes[-1].strip()
    said = _ANSWER_IS.findall(text)
    if said:
        ans = said[-1].strip()
        # "Final Answer: The final answer is $8$. I hope it is correct." (Minerva format)
        for _ in range(3):
            inner = _ANSWER_IS.findall(ans)
            if not inner:
                break
            ans = inner[-1].strip()
        # Cut at the end of the sentence ("3.5 because..." keeps "3.5").
        ans = re.split(r"\.(?:\s|$)", ans, maxsplit=1)[0]
        ans = ans.strip().rstrip(".").strip().strip("*_").strip()  # markdown **42**
        if ans:
            return _unwrap_math(ans)
    stripped = _unwrap_math(text.strip())
    if _is_bare(stripped):
        return stripped
    for m in reversed(_NUMBER_LIKE.findall(text)):
        cand = next(g for g in m if g)
        if re.search(r"\d", cand):
            return cand.strip().rstrip(".,").strip() or None
    return None


# -------------------------------------------------------------------------- normalisation

_TEXT_CMD = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3})((?:,\d{3})+)(?![\d])")
# Words are separated by required whitespace, so the match is linear: a nested
# `(?:[A-Za-z]+\s*)+` backtracks exponentially on a long non-matching tail.
_UNIT_WORD = r"[A-Za-z]+\.?(?:\^\{?\d\}?)?"
_UNIT_TAIL = re.compile(rf"^(-?[\d./]+)(\s*)({_UNIT_WORD}(?:\s+{_UNIT_WORD})*)\s*$")
_SCALE_WORDS = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_MATH_WORDS = {"pi", "e", "i", "sqrt", "sin", "cos", "tan", "log", "ln", "exp", "inf", "infinity",
               "oo", "mod", "choose"}
_ASSIGN = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=])")
_FRAC = re.compile(r"\\frac\s*\{\s*(-?[\d.]+)\s*\}\s*\{\s*(-?[\d.]+)\s*\}")
_FRAC_SHORT = re.compile(r"\\frac\s*(\d)\s*(\d)")
_NUMERIC = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?$")
_NUM_FRACTION = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))/([+-]?(?:\d+\.?\d*|\.\d+))$")
_UNIT_WORDS = re.compile(
    r"\s*\b(?:dollars?|cents?|usd|percent|degrees?|units?|sq\.?\s*units?)\b\.?", re.IGNORECASE
)


def _strip_unit_tail(s: str) -> str:
    # "18 dollars", "5 cm^2", "3.5 because" -> the number; but "2x", "2pi", "1e3" stay,
    # and "1.5 million" is 1500000, not 1.5.
    if len(s) > 200:  # no number-with-unit is this long; keeps the regex cheap
        return s
    m = _UNIT_TAIL.match(s)
    if not m:
        return s
    words = re.findall(r"[A-Za-z]+", m.group(3))
    if any(w.lower() in _MATH_WORDS for w in words):
        return s
    scale = _SCALE_WORDS.get(words[0].lower())
    if scale is not None:
        value = parse_rational(m.group(1))
        return s if value is None else format_rational(value * scale)
    if not m.group(2) and len(words[0]) < 2:
        return s
    return m.group(1)


def parse_rational(s: str) -> Fraction | None:
    """Exact value of a plain number (``-12``, ``.5``, ``1e3``, ``3/4``, ``1.5/2``), else None."""
    try:
        if _NUMERIC.match(s):
            return Fraction(s)
        m = _NUM_FRACTION.match(s)
        if m:
            den = Fraction(m.group(2))
            return Fraction(m.group(1)) / den if den else None
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


def format_rational(x: Fraction) -> str:
    """``x`` in one spelling: ``3``, ``0.25``, ``1/3``."""
    # One spelling per value: integers plain, terminating decimals as decimals,
    # everything else p/q. Keeps "1/2", "0.50", "\frac{1}{2}" on one voting key.
    if x.denominator == 1:
        return str(x.numerator)
    d = x.denominator
    twos = fives = 0
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d == 1 and max(twos, fives) <= 30:
        digits = max(twos, fives)
        scaled = abs(x.numerator) * (10**digits) // x.denominator
        sign = "-" if x < 0 else ""
        whole, frac = divmod(scaled, 10**digits)
        return f"{sign}{whole}.{str(frac).rjust(digits, '0').rstrip('0')}"
    return f"{x.numerator}/{x.denominator}"


def normalize_answer(s: str | None) -> str:
    """Canonical string form of an answer, for comparison and voting.

    Drops surrounding ``$``/``\\(\\)``, a whole ``\\boxed{}``, ``\\text{}``-style
    wrappers, ``\\left``/``\\right`` and LaTeX spacing, ``$`` and ``\\$``, thousands
    commas, ``%``, degree marks, trailing unit words after a number, a leading
    ``x =``, a trailing ``.``; maps ``\\dfrac``/``\\tfrac`` to ``\\frac`` and
    ``(C)`` to ``C``; prints every rational number one way (``0.5`` for
    ``\\frac{1}{2}``, ``1/2`` and ``0.50``). Percent is dropped, not divided:
    ``10%`` becomes ``10``.

    Example:
        >>> normalize_answer(r"\\$1,000.00")
        '1000'
        >>> normalize_answer(r"x = \\dfrac{3}{6}")
        '0.5'
    """
    if s is None:
        return ""
    s = str(s).strip()
    if s.startswith(KEY_PREFIX):  # a tool-call answer's key is canonical already
        return s
    boxed = extract_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
    if boxed is not None:
        s = boxed
    s = re.sub(r"^\*\*(.+)\*\*$", r"\1", s).strip()  # markdown bold around the answer
    s = _unwrap_math(s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\left\s*|\\right\s*", "", s)
    s = re.sub(r"\\[!,;:> ]|~", " ", s)
    for _ in range(3):  # nested \text{\textbf{...}}
        s, n = _TEXT_CMD.subn(r"\1", s)
        if not n:
            break
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|°|\\circ", "", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
    s = _UNIT_WORDS.sub("", s)
    s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(",", ""), s)
    s = s.strip().rstrip(".").strip()
    s = _ASSIGN.sub("", s) if s.count("=") == 1 else s
    m = re.fullmatch(r"\(?\s*([A-Za-z])\s*\)", s) or re.fullmatch(r"\(\s*([A-Za-z])\s*\)?", s)
    if m:
        s = m.group(1)
    s = _strip_unit_tail(s)
    s = _FRAC.sub(r"\1/\2", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    s = re.sub(r"\\sqrt\s*(\d)", r"\\sqrt{\1}", s)
    s = re.sub(r"\s+", " ", s).strip()
    if re.search(r"[\d\\]", s):
        s = s.replace(" ", "")
    s = s.removeprefix("+")
    value = parse_rational(s)
    if value is not None:
        return format_rational(value)
    return s


# ---------------------------------------------------------------------------- equivalence


def _numbers_equal(a: Fraction, b: Fraction) -> bool:
    if a == b:
        return True
    # Rounded decimals ("0.333333" vs 1/3): relative 1e-6, as math-verify's float_rounding=6.
    fa, fb = float(a), float(b)
    return math.isclose(fa, fb, rel_tol=1e-6, abs_tol=1e-9)


def _quick_equivalent(na: str, nb: str) -> bool | None:
    """Settle cheap cases on normalised strings; None when symbolic work is needed."""
    if not na or not nb:
        return False
    if na == nb:
        return True
    if "\\" not in na + nb and na.casefold() == nb.casefold():
        return True
    xa, xb = parse_rational(na), parse_rational(nb)
    if xa is not None and xb is not None:
        return _numbers_equal(xa, xb)
    # A number against a bare word ("12" vs "twelve" or "C") needs no sympy: different.
    plain_word = re.compile(r"[A-Za-z ]+")
    if ((xa is not None and plain_word.fullmatch(nb))
            or (xb is not None and plain_word.fullmatch(na))):
        return False
    return None


def _equivalent(a: str, b: str, timeout: float) -> tuple[bool, str]:
    na, nb = normalize_answer(a), normalize_answer(b)
    quick = _quick_equivalent(na, nb)
    if quick is not None:
        return quick, "normalized"
    return symbolic_compare(na, nb, timeout)


def is_equivalent(a: str | None, b: str | None, timeout: float = 5.0) -> bool:
    """Whether two extracted answers mean the same mathematical object.

    Normalised string and exact-number comparison first; then math-verify
    (``parse`` + ``verify``) and a sympy fallback in a worker process that is
    killed after ``timeout`` seconds (a pathological expression gives False, it
    cannot hang the caller). Safe to call from any thread.

    Example:
        >>> is_equivalent("90^\\\\circ", "90"), is_equivalent("x = 5", "5"), is_equivalent("2", "3")
        (True, True, False)
    """
    if a is None or b is None:
        return False
    return _equivalent(a, b, timeout)[0]


# ------------------------------------------------------------------------------ verifiers


class MathVerifier:
    """Math answers against a gold answer, by equivalence.

    The answer (and the gold, if it is a whole solution) goes through
    :func:`extract_answer`; then :func:`is_equivalent`. Symbolic work runs off
    the event loop, in a worker process with a hard timeout.

    Example:
        >>> import asyncio
        >>> v = MathVerifier()
        >>> t = Task.from_prompt("Half of one?")
        >>> asyncio.run(v.verify(t, "It is \\\\boxed{\\\\dfrac{1}{2}}", "0.5")).passed
        True
    """

    name = "math"

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        if gold is None:
            raise InvalidRequestError("the math verifier needs a gold answer", param="gold")
        pred = extract_answer(answer)
        ref = extract_answer(gold) or gold.strip()
        if pred is None:
            return Verdict.of(False, {"extracted": None, "gold": ref, "reason": "no answer found"})
        na, nb = normalize_answer(pred), normalize_answer(ref)
        quick = _quick_equivalent(na, nb)
        if quick is not None:
            ok, how = quick, "normalized"
        else:
            ok, how = await asyncio.to_thread(symbolic_compare, na, nb, self.timeout)
        return Verdict.of(ok, {"extracted": pred, "gold": ref, "method": how})


class GSM8KVerifier:
    """GSM8K scoring exactly as lm-evaluation-harness does it.

    ``mode="strict"`` takes the first ``#### n`` (with ``cot=True``: the first
    "The answer is n."); ``mode="flexible"`` the last number. Both sides then
    get the harness's normalisation (:func:`gsm8k_normalize`) and must match
    as strings; the gold may be the bare number or the full reference solution.
    ``lenient=True`` also accepts numerically equal forms (``18.00`` vs ``18``),
    which the harness does not.

    Example:
        >>> import asyncio
        >>> v = GSM8KVerifier(mode="strict")
        >>> asyncio.run(v.verify(Task.from_prompt("?"), "2 + 2 = 4\\n#### 4", "4")).passed
        True
    """

    name = "gsm8k"

    def __init__(self, mode: Literal["strict", "flexible"] = "flexible", *, cot: bool = False,
                 lenient: bool = False) -> None:
        if mode not in ("strict", "flexible"):
            raise InvalidRequestError(f"gsm8k mode must be strict or flexible, not {mode!r}")
        self.mode = mode
        self.cot = cot
        self.lenient = lenient

    def extract(self, text: str) -> str | None:
        """The prediction as this mode's harness filter extracts it."""
        if self.mode == "strict":
            return extract_gsm8k_strict(text, cot=self.cot)
        return extract_gsm8k_flexible(text)

    async def verify(self, task: Task, answer: str, gold: str | None = None) -> Verdict:
        if gold is None:
            raise InvalidRequestError("the gsm8k verifier needs a gold answer", param="gold")
        pred = self.extract(answer)
        ref = gsm8k_normalize(gold)
        if pred is None:
            return Verdict.of(False, {"extracted": None, "gold": ref, "reason": "[invalid]"})
        got = gsm8k_normalize(pred)
        ok = got == ref
        if not ok and self.lenient:
            a, b = parse_rational(got), parse_rational(ref)
            ok = a is not None and b is not None and a == b
        return Verdict.of(ok, {"extracted": pred, "normalized": got, "gold": ref,
                               "mode": self.mode})
