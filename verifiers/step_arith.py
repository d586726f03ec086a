"""Arithmetic step scorer: a calculator used as a process reward model.

Every equation a step writes (``5 boxes * 12 = 60``, ``20% of 50 = 10``,
``$3.50 + $1.25 = $4.75``, ``a * b = c = d``) is recomputed exactly, with
:class:`fractions.Fraction`, never float, so ``0.1 + 0.2 = 0.3`` is right and
``1/3`` stays ``1/3``. A step with a wrong equation scores 0, a step whose
equations are all right scores 1, and a step with none scores a neutral 0.5:
the search should prefer steps it can check over prose, but prose is how a
solution explains itself and must not be killed for it.

What is read: numbers with thousands commas, decimals, currency signs and
trailing unit words (``7 apples``); ``+ - * / x × · ÷ ^`` and their LaTeX
spellings, parentheses, unary minus, precedence; ``50%`` as 1/2 and ``of`` as
multiplication after a percentage or a fraction; simple ``\\frac{3}{4}``.
A stated result may be rounded to the precision it is written with
(``10 / 3 = 3.33``), an ``≈`` allows rounding to a whole number too, and a
trailing ``...`` means "these digits, then more".

What is not read, on purpose: anything that only looks like an equation is
passed over rather than risk a wrong verdict on a right step. Dates, clock
times, list numbering, ranges ``3-4``, assignments ``x = 5``, algebra
(``2x + 3 = 7``), functions (``sqrt 16 + 9 = 5``), word operators (``3 times
4``), sums of different units (``2 hours + 30 minutes``), a percentage added
to a plain number (``50 + 10% = 55``). A skipped equation counts for nothing.

Example:
    >>> check_step("5 boxes * 12 = 60, and 60 + 7 = 66").equations[1].describe()
    '60 + 7 = 66: wrong, it is 67'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

from refinery.engine.context import Context
from refinery.engine.types import Task
from refinery.verifiers.math import format_rational, parse_rational

__all__ = ["RIGHT", "UNCHECKED", "WRONG", "ArithStepScorer", "EquationCheck", "StepCheck",
           "check_step"]

RIGHT, WRONG, UNCHECKED = 1.0, 0.0, 0.5

# ----------------------------------------------------------------------------- tokens

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
# Order matters: at each position the first alternative that matches wins.
_PATTERNS = (
    # A line's bullet or its "1." / "2)" numbering is not a minus sign or a number.
    ("bullet", r"^[ \t]*(?:[-*+•·]|\d+[.)])(?=[ \t])"),
    # Spacing, math delimiters, \boxed (its braces stay, as brackets), markdown bold.
    ("space", r"\n|[^\S\n]+|[\u00a0\u2009\u202f]+|&|\*{2,}(?!\d)|(?<!\d)\*{2,}|_{2,}"
              r"|\\[,;:! ]|\\q?quad\b|\\[()\[\]]|\\(?:left|right|displaystyle|boxed|fbox)\b"),
    ("date", r"\d{4}-\d{1,2}-\d{1,2}\b|\d{1,2}/\d{1,2}/\d{4}\b"),
    ("time", r"\d{1,2}:\d{2}(?::\d{2})?(?!\d)"),
    # "3,5" (a decimal comma) or "1,2,3" (a list) is no number to compute with;
    # "1,234" is.
    ("commas", r"(?!\d{1,3}(?:,\d{3})+(?![,\d]))\d+(?:,\d+)+"),
    ("frac", r"\\[dt]?frac\s*(?:\{\s*(?P<fn>-?\d+(?:\.\d+)?)\s*\}\s*\{\s*(?P<fd>\d+(?:\.\d+)?)"
             r"\s*\}|(?P<fa>\d)(?P<fb>\d))"),
    ("text", r"\\(?:text|mathrm|textrm|mbox)\s*\{(?P<tw>[^{}]*)\}"),
    ("num", rf"(?P<cur>\\?[$€£]\s?)?(?P<digits>{_NUMBER})(?P<ell>\.\.\.|…|\\[lc]?dots\b)?"
            r"(?P<pct>\s*(?:\\?%|percent\b|per cent\b))?"),
    ("dollar", r"\\?\$"),
    ("noteq", r"==+|=>|<=|>=|!=|:=|=<|[≠≤≥]|\\(?:neq?|[lg]eq?(?:slant)?)\b"),
    ("eq", r"=|[≈≃]|~=|\\approx\b"),
    ("pow", r"(?<=\d)\*\*(?=\d)|\^"),
    ("op", r"[-+*/×·⋅∗÷−]|\\(?:times|cdot|ast|div)\b"),
    ("lp", r"[({]"),
    ("rp", r"[)}]"),
    ("word", r"[A-Za-z]+"),
    ("cmd", r"\\[A-Za-z]+"),
    ("other", r"."),
)
# ASCII: "\d" must not take other scripts' digits, which Fraction would then misread.
_TOKEN = re.compile("|".join(f"(?P<{k}>{p})" for k, p in _PATTERNS),
                    re.MULTILINE | re.DOTALL | re.ASCII)
_SKIPPED = {"bullet", "space", "dollar"}
_KINDS = {"date": "opaque", "time": "opaque", "commas": "opaque", "cmd": "opaque", "noteq": "punct",
          "other": "punct", "pow": "op"}
_OPS = {"×": "*", "·": "*", "⋅": "*", "∗": "*", "÷": "/", "−": "-", "\\times": "*",
        "\\cdot": "*", "\\ast": "*", "\\div": "/", "**": "^"}
_SCALES = ("dozen", "hundred", "thousand", "million", "billion", "trillion")
# Words that change what the number beside them means ("sqrt 16 + 9", "half of
# 10 + 2", "12 divided by 3 + 1"): an expression they touch is not read.
_MODIFIERS = frozenset({
    "of", "sqrt", "root", "log", "ln", "sin", "cos", "tan", "exp", "half", "twice", "double",
    "triple", "square", "squared", "cube", "cubed", "minus", "plus", "times", "over", "by",
    "mod", "factorial", "negative", "power", "pi", *_SCALES})
# ... and words that do so from behind ("= 7 squared", "= 3 million").
_AFTER = frozenset({"squared", "cubed", "factorial", "pi", *_SCALES})
_MAX_DIGITS = 200  # a longer digit string is an identifier or noise, not a quantity
_MAX_UNIT_WORDS = 3


@dataclass(slots=True)
class _Tok:
    kind: str  # num op lp rp eq word var opaque punct
    text: str
    start: int
    end: int
    op: str = ""  # "+-*/^" for an operator, "=" or "≈" for an equals sign
    value: Fraction = Fraction(0)
    decimals: int = 0
    percent: bool = False
    ellipsis: bool = False
    frac: bool = False
    unit: str = ""  # unit words after a number, absorbed into it
    uend: int = -1  # where the number's unit words end


def _number(m: re.Match[str]) -> _Tok:
    digits = m["digits"].replace(",", "")
    value = parse_rational(digits) if len(digits) <= _MAX_DIGITS else None
    if value is None:
        return _Tok("opaque", m[0], m.start(), m.end())
    decimals = len(digits.partition(".")[2])
    return _Tok("num", m[0], m.start(), m.end(), value=value, decimals=decimals,
                percent=bool(m["pct"]), ellipsis=bool(m["ell"]))


def _fraction(m: re.Match[str]) -> _Tok:
    num, den = (m["fn"], m["fd"]) if m["fn"] is not None else (m["fa"], m["fb"])
    if Fraction(den) == 0:
        return _Tok("opaque", m[0], m.start(), m.end())
    return _Tok("num", m[0], m.start(), m.end(), value=Fraction(num) / Fraction(den), frac=True)


def _token(m: re.Match[str]) -> _Tok | None:
    kind = m.lastgroup or "other"
    if kind in _SKIPPED:
        return None
    if kind == "num":
        return _number(m)
    if kind == "frac":
        return _fraction(m)
    if kind == "text":
        words = m["tw"].strip()
        ok = bool(re.fullmatch(r"[A-Za-z]+(?: [A-Za-z]+)*", words))
        return _Tok("word" if ok else "opaque", words if ok else m[0], m.start(), m.end())
    if kind == "eq":
        return _Tok("eq", m[0], m.start(), m.end(), op="=" if m[0] == "=" else "≈")
    tok = _Tok(_KINDS.get(kind, kind), m[0], m.start(), m.end())
    if tok.kind == "op":
        tok.op = _OPS.get(m[0], m[0])
    return tok


def _retag(toks: list[_Tok]) -> None:
    """Words that act as operators become operators, single letters variables."""
    for i, t in enumerate(toks):
        if t.kind != "word":
            continue
        prev = toks[i - 1] if i else None
        nxt = toks[i + 1] if i + 1 < len(toks) else None
        operand_next = nxt is not None and nxt.kind in ("num", "lp")
        if t.text in ("x", "X") and operand_next and prev is not None and (
                prev.kind in ("num", "rp") or (prev.kind == "word" and len(prev.text) > 1)):
            t.kind, t.op = "op", "*"  # "5 x 12", "5 boxes x 12"
        elif t.text.lower() == "of" and operand_next and prev is not None and _of_left(toks, i):
            t.kind, t.op = "op", "*"  # "20% of 50", "3/4 of 12"
        elif len(t.text) == 1:
            t.kind = "var"


def _of_left(toks: list[_Tok], i: int) -> bool:
    # "of" multiplies after a share (a percentage, a fraction, a bracket), not after
    # a count: "5 of 12 eggs" is no product.
    prev = toks[i - 1]
    if prev.kind == "rp":
        return True
    if prev.kind != "num":
        return False
    divided = i >= 2 and toks[i - 2].kind == "op" and toks[i - 2].op == "/"
    return prev.percent or prev.frac or divided


def _plain_int(t: _Tok) -> bool:
    return (t.kind == "num" and t.decimals == 0 and not (t.percent or t.frac or t.ellipsis)
            and t.text.isdigit())


def _tight(*toks: _Tok) -> bool:
    return all(a.end == b.start for a, b in zip(toks, toks[1:], strict=False))


def _is_range(toks: list[_Tok], i: int) -> bool:
    """``3-4``, ``10-15``, ``555-1234``: written tight and rising, a range or a code."""
    if i + 2 >= len(toks):
        return False
    a, dash, b = toks[i:i + 3]
    if not (dash.op == "-" and _plain_int(a) and _plain_int(b) and _tight(a, dash, b)
            and a.value < b.value):
        return False
    # Inside a longer tight computation ("16-3-4") it is a subtraction.
    before = toks[i - 1] if i else None
    after = toks[i + 3] if i + 3 < len(toks) else None
    return not ((before is not None and before.kind == "op" and _tight(before, a))
                or (after is not None and after.kind == "op" and _tight(b, after)))


def _drop_ranges(toks: list[_Tok]) -> list[_Tok]:
    out: list[_Tok] = []
    i = 0
    while i < len(toks):
        if _is_range(toks, i):
            a, b = toks[i], toks[i + 2]
            out.append(_Tok("opaque", f"{a.text}-{b.text}", a.start, b.end))
            i += 3
        else:
            out.append(toks[i])
            i += 1
    return out


def _unit_word(t: _Tok) -> bool:
    return t.kind == "word" and len(t.text) > 1 and t.text.lower() not in _MODIFIERS


def _units_end(toks: list[_Tok], i: int) -> int:
    """Where the unit words starting at ``toks[i]`` end (``boxes``, ``miles/hour``)."""
    j = i
    while j < len(toks) and j - i < _MAX_UNIT_WORDS and _unit_word(toks[j]):
        j += 1
        if j + 1 < len(toks) and toks[j].op == "/" and _unit_word(toks[j + 1]) and _tight(
                *toks[j - 1:j + 2]):
            j += 2
    return j


def _absorb_units(toks: list[_Tok]) -> list[_Tok]:
    """Unit words between a number and an operator join the number: ``5 boxes * 12``."""
    out: list[_Tok] = []
    i = 0
    while i < len(toks):
        t = toks[i]
        out.append(t)
        i += 1
        j = _units_end(toks, i) if t.kind == "num" else i
        if j > i and j < len(toks) and toks[j].kind in ("op", "rp", "eq"):
            t.unit = " ".join(w.text.lower() for w in toks[i:j] if w.kind == "word")
            t.uend = toks[j - 1].end
            i = j
    return out


def _mixed(toks: list[_Tok], i: int) -> bool:
    # "1 1/2": a spaced whole number then a tight fraction is one mixed number,
    # which this calculator does not read.
    return (i >= 1 and i + 2 < len(toks) and _plain_int(toks[i - 1]) and _plain_int(toks[i])
            and toks[i + 1].op == "/" and _plain_int(toks[i + 2]) and _tight(*toks[i:i + 3]))


def _tokenize(text: str) -> list[_Tok]:
    toks = [t for m in _TOKEN.finditer(text) if (t := _token(m)) is not None]
    _retag(toks)
    return _absorb_units(_drop_ranges(toks))


# ------------------------------------------------------------------- finding equations


def _follows(a: _Tok, b: _Tok) -> bool:
    """Whether ``b`` may come right after ``a`` inside one arithmetic expression."""
    if a.kind in ("num", "rp"):
        return b.kind in ("op", "rp")
    if a.kind in ("op", "lp"):
        return b.kind in ("num", "lp") or (b.kind == "op" and b.op in "+-")
    return False


def _glued(a: _Tok, b: _Tok) -> bool:
    return a.end == b.start


def _left_taint(toks: list[_Tok], start: int) -> bool:
    """Whether what stands before a left side makes it more than arithmetic.

    ``x + 3``, ``2(3 + 4)``, ``sqrt 16 + 9``, ``Total - 3``: the expression
    found is the tail of something bigger, so its value is not what was meant.
    """
    first = toks[start]
    before = toks[start - 1] if start else None
    if first.kind == "op":
        glued_sign = first.op in "+-" and _glued(first, toks[start + 1])
        opener = before is None or before.kind in ("eq", "punct", "lp")
        if not (glued_sign and (opener or before.kind == "word")):
            return True
    if before is None:
        return False
    if before.kind == "opaque" or before.kind == "op":
        return True
    if before.kind == "word" and before.text.lower() in _MODIFIERS:
        return True
    if _mixed(toks, start):
        return True
    if before.kind == "punct":
        return _glued(before, first) and before.text in "_^!|'."
    return _glued(before, first) and before.kind in ("num", "rp", "var", "word")


def _left_run(toks: list[_Tok], eq: int) -> tuple[int, int] | None:
    """The longest expression ending right before the equals sign ``toks[eq]``."""
    end = eq - 1
    if end < 0 or toks[end].kind not in ("num", "rp"):
        return None
    depth, i = 0, end
    while True:
        t = toks[i]
        depth += (t.kind == "rp") - (t.kind == "lp")
        if i == 0 or not _follows(toks[i - 1], t) or (toks[i - 1].kind == "lp" and depth == 0):
            break
        i -= 1
    if depth != 0 or _left_taint(toks, i):
        return None
    return i, end


def _right_taint(toks: list[_Tok], end: int, scanned: int) -> bool:
    """Whether what follows a right side makes it more than arithmetic.

    ``= 7x``, ``= 2^n``, ``= 5!``, ``= 7 squared``, ``= 7 - y``: the number
    found is the head of something bigger. ``= 60 miles/hour`` is a number.
    """
    nxt = toks[end + 1] if end + 1 < len(toks) else None
    if nxt is None:
        return False
    if end < scanned:  # an operator dangles: only a "per" unit may follow it
        after = toks[scanned + 1] if scanned + 1 < len(toks) else None
        per_unit = nxt.op == "/" and after is not None and _unit_word(after)
        return not (per_unit or after is None or after.kind in ("punct", "eq"))
    if nxt.kind == "word" and nxt.text.lower() in _AFTER:
        return True
    if _mixed(toks, end + 1):
        return True
    if nxt.kind == "punct":
        return _glued(toks[end], nxt) and nxt.text in "!_^'"
    return _glued(toks[end], nxt) and nxt.kind in ("var", "opaque", "lp", "num")


def _right_run(toks: list[_Tok], eq: int) -> tuple[int, int] | None:
    """The longest expression starting right after the equals sign ``toks[eq]``."""
    start = eq + 1
    if start >= len(toks) or not (toks[start].kind in ("num", "lp")
                                  or (toks[start].kind == "op" and toks[start].op in "+-")):
        return None
    depth, j = 0, start
    while True:
        t = toks[j]
        depth += (t.kind == "lp") - (t.kind == "rp")
        last = j + 1 >= len(toks)
        if last or not _follows(t, toks[j + 1]) or (toks[j + 1].kind == "rp" and depth == 0):
            break
        j += 1
    scanned = j
    while j >= start and toks[j].kind in ("op", "lp"):
        depth -= toks[j].kind == "lp"
        j -= 1
    if j < start or depth != 0 or _right_taint(toks, j, scanned):
        return None
    return start, j


# ------------------------------------------------------------------------ evaluation


class _Skip(Exception):
    """An expression this calculator does not judge (too big, ambiguous, malformed)."""


class _Undefined(Exception):
    """A division by zero: the side has no value, so no stated result can be right."""


_MAX_DEPTH = 64  # brackets and signs nested deeper are noise, and would exhaust the stack
_MAX_EXPONENT = 64
_MAX_BASE_BITS = 64


class _Parser:
    """Recursive descent over one side's tokens: sums of products of signed powers.

    Values travel with a flag saying whether they are a bare percentage, so that
    ``50 + 10%`` (a tenth of what?) can be refused rather than guessed.
    """

    def __init__(self, toks: list[_Tok]) -> None:
        self.toks, self.i, self.depth = toks, 0, 0

    def parse(self) -> Fraction:
        value, _ = self._sum()
        if self.i != len(self.toks):
            raise _Skip
        return value

    def _peek(self, ops: str) -> str | None:
        t = self.toks[self.i] if self.i < len(self.toks) else None
        return t.op if t is not None and t.kind == "op" and t.op in ops else None

    def _sum(self) -> tuple[Fraction, bool]:
        left, pct = self._product()
        while (op := self._peek("+-")) is not None:
            self.i += 1
            right, right_pct = self._product()
            if pct != right_pct:
                raise _Skip
            left = left + right if op == "+" else left - right
        return left, pct

    def _product(self) -> tuple[Fraction, bool]:
        left, pct = self._unary()
        while (op := self._peek("*/")) is not None:
            self.i += 1
            right, _ = self._unary()
            if op == "/" and right == 0:
                raise _Undefined
            left, pct = (left * right if op == "*" else left / right), False
        return left, pct

    def _unary(self) -> tuple[Fraction, bool]:
        op = self._peek("+-")
        if op is None:
            return self._power()
        self.i += 1
        value, pct = self._nested(self._unary)
        return (-value if op == "-" else value), pct

    def _power(self) -> tuple[Fraction, bool]:
        base, pct = self._atom()
        if self._peek("^") is None:
            return base, pct
        self.i += 1
        exp, _ = self._nested(self._unary)
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if exp.denominator != 1 or abs(exp) > _MAX_EXPONENT or bits > _MAX_BASE_BITS:
            raise _Skip
        if base == 0 and exp < 0:
            raise _Undefined
        return base ** int(exp), False

    def _atom(self) -> tuple[Fraction, bool]:
        if self.i >= len(self.toks):
            raise _Skip
        t = self.toks[self.i]
        self.i += 1
        if t.kind == "num":
            return (t.value / 100 if t.percent else t.value), t.percent
        if t.kind != "lp":
            raise _Skip
        value = self._nested(self._sum)
        if self.i >= len(self.toks) or self.toks[self.i].kind != "rp":
            raise _Skip
        self.i += 1
        return value

    def _nested(self, rule: Callable[[], tuple[Fraction, bool]]) -> tuple[Fraction, bool]:
        if self.depth >= _MAX_DEPTH:
            raise _Skip
        self.depth += 1
        try:
            return rule()
        finally:
            self.depth -= 1


@dataclass(slots=True)
class _Side:
    """One side of an equation: its value and how it is written."""

    value: Fraction | None  # None: it divides by zero
    literal: _Tok | None  # the number, when the side is one (signed) number
    negative: bool
    arithmetic: bool  # an operator or a \\frac: something to compute


def _stem(unit: str) -> str:
    # "apple"/"apples", "box"/"boxes", "hour"/"hours" are one unit.
    return " ".join(w.rstrip("s").rstrip("e") for w in unit.split())


def _side(toks: list[_Tok], span: tuple[int, int]) -> _Side | None:
    """The side ``toks[span[0]..span[1]]``, or None when it is not to be judged."""
    part = toks[span[0]:span[1] + 1]
    binary = [t for k, t in enumerate(part)
              if t.kind == "op" and k and part[k - 1].kind in ("num", "rp")]
    units = {_stem(t.unit) for t in part if t.unit}
    if len(units) > 1 and any(t.op in "+-" for t in binary):
        return None  # "2 hours + 30 minutes": the sum is in neither unit
    try:
        value: Fraction | None = _Parser(part).parse()
    except _Undefined:
        value = None
    except _Skip:
        return None
    bare = [t for t in part if t.kind not in ("lp", "rp")]  # "(7)", "\boxed{7}" are numbers
    signs, last = bare[:-1], bare[-1]
    plain = last.kind == "num" and not last.frac and all(t.kind == "op" for t in signs)
    negative = sum(t.op == "-" for t in signs) % 2 == 1
    return _Side(value, last if plain else None, negative,
                 bool(binary) or any(t.frac for t in part))


def _readings(side: _Side, approx: bool) -> list[tuple[Fraction, Fraction, bool]]:
    """What a side may mean as written: ``(value, tolerance, strict)`` triples.

    A computed side means its exact value. A written number with ``d`` decimals
    stands for anything that rounds to it (``3.33`` for 10/3), one with ``...``
    for anything it truncates, a whole number for itself unless the sign is
    ``≈``. A bare percentage reads both ways: ``10 / 50 = 20%`` and
    ``0.2 * 100 = 20%`` are both how people write it.
    """
    t = side.literal
    if t is None or side.value is None:
        return [(side.value or Fraction(0), Fraction(0), False)]
    value = -t.value if side.negative else t.value
    forms = [(value / 100, t.decimals + 2), (value, t.decimals)] if t.percent else [
        (value, t.decimals)]
    rounded = t.decimals > 0 or approx  # "= 3" means 3; "= 3.0" means 2.95 to 3.05
    out = []
    for v, d in forms:
        if t.ellipsis:
            out.append((v, Fraction(1, 10**d), True))
        elif rounded:
            out.append((v, Fraction(5, 10 ** (d + 1)), False))
        else:
            out.append((v, Fraction(0), False))
    return out


def _matches(value: Fraction, reading: tuple[Fraction, Fraction, bool]) -> bool:
    stated, tol, strict = reading
    diff = abs(value - stated)
    return diff < tol if strict else diff <= tol


# ---------------------------------------------------------------------------- results


def _show(x: Fraction) -> str:
    # int-to-str refuses past ~4300 digits; such a value is still a wrong one.
    if max(x.numerator.bit_length(), x.denominator.bit_length()) > 12_000:
        return "a number too long to print"
    return format_rational(x)


@dataclass(frozen=True)
class EquationCheck:
    """One ``=`` of a step as written, and what recomputing it gave.

    ``value`` is the exact value of the side that was computed (the non-number
    side, else the left), ``stated`` the other side's value; either is None
    where it divides by zero.
    """

    text: str
    ok: bool
    value: Fraction | None
    stated: Fraction | None

    def describe(self) -> str:
        """A line for a trace: ``"3 * 4 = 11: wrong, it is 12"``."""
        if self.ok:
            return f"{self.text}: right"
        if self.value is None or self.stated is None:
            return f"{self.text}: wrong, it divides by zero"
        return f"{self.text}: wrong, it is {_show(self.value)}"


@dataclass(frozen=True)
class StepCheck:
    """Every equation found in one step, each recomputed, and the step's score."""

    text: str
    equations: tuple[EquationCheck, ...]

    @property
    def wrong(self) -> tuple[EquationCheck, ...]:
        return tuple(e for e in self.equations if not e.ok)

    @property
    def score(self) -> float:
        """1 all right, 0 any wrong, 0.5 nothing to check (prose is not penalised)."""
        if not self.equations:
            return UNCHECKED
        return WRONG if self.wrong else RIGHT


def _agree(computed: _Side, stated: _Side, approx: bool) -> bool:
    if computed.value is None or stated.value is None:
        return False
    if any(_matches(computed.value, r) for r in _readings(stated, approx)):
        return True
    # Two written numbers ("3.333 = 3.33"): either may be the rounded one.
    return computed.literal is not None and any(
        _matches(stated.value, r) for r in _readings(computed, approx))


def _judge(text: str, toks: list[_Tok], eq: int, left: _Span,
           right: _Span) -> EquationCheck | None:
    """Recompute one link ``left = right``; None when a side is not to be judged."""
    a, b = _side(toks, left), _side(toks, right)
    if a is None or b is None:
        return None
    computed, stated = (b, a) if a.literal is not None and b.literal is None else (a, b)
    approx = toks[eq].op == "≈"
    ok = _agree(computed, stated, approx)
    if not ok and b.arithmetic and toks[right[0]].kind == "num":
        # A running total, "2 * 3 = 6 * 2 = 12": the right side's first number is
        # this link's result and the rest is the next link's work.
        head = _side(toks, (right[0], right[0]))
        if head is not None and _agree(a, head, approx):
            ok, computed, stated, right = True, a, head, (right[0], right[0])
    last = toks[right[1]]
    shown = " ".join(text[toks[left[0]].start:max(last.end, last.uend)].split())
    return EquationCheck(shown, ok, computed.value, stated.value)


_Span = tuple[int, int]
_Link = tuple[int, _Span | None, _Span | None]  # an equals sign and its two sides


def _chains(toks: list[_Tok]) -> list[list[_Link]]:
    """The equals signs grouped into chains: ``a = b = c`` shares ``b`` between two links."""
    chains: list[list[_Link]] = []
    for eq in (i for i, t in enumerate(toks) if t.kind == "eq"):
        link = (eq, _left_run(toks, eq), _right_run(toks, eq))
        if chains and link[1] is not None and link[1] == chains[-1][-1][2]:
            chains[-1].append(link)
        else:
            chains.append([link])
    return chains


def check_step(text: str) -> StepCheck:
    """Find and recompute every equation in one step of a solution.

    Links of a chain (``3 * 4 = 12 = 12.0``) are checked one by one; a chain
    with no operator anywhere (``x = 5``, ``1 hour = 60 minutes``) is a
    definition, not a computation, and is not checked.

    Example:
        >>> [e.ok for e in check_step("10 / 3 = 3.33, so 3.33 * 3 = 9.99 = 10").equations]
        [True, True, False]
    """
    toks = _tokenize(text)
    found: list[EquationCheck] = []
    for chain in _chains(toks):
        sides = [_side(toks, s) for _, *pair in chain for s in pair if s is not None]
        if not any(s is not None and s.arithmetic for s in sides):
            continue
        for eq, left, right in chain:
            check = _judge(text, toks, eq, left, right) if left and right else None
            if check is not None:
                found.append(check)
    return StepCheck(text, tuple(found))


class ArithStepScorer:
    """A :class:`~refinery.verifiers.steps.StepScorer` that recomputes each step's arithmetic.

    No model call and no context: each step is scored by :func:`check_step`,
    1.0 when every equation it writes is right, 0.0 when one is wrong, 0.5 when
    it writes none (so a checkable right step outranks prose, and prose still
    outranks a miscalculation).

    Example:
        >>> import asyncio
        >>> scorer = ArithStepScorer()
        >>> steps = ["She buys 3 packs.", "3 * 12 = 36 eggs", "36 - 5 = 30"]
        >>> asyncio.run(scorer.score(Task.from_prompt("?"), [steps], ctx=None))
        [[0.5, 1.0, 0.0]]
    """

    name = "arith"

    async def score(self, task: Task, paths: Sequence[Sequence[str]],
                    ctx: Context | None) -> list[list[float]]:
        """``result[i][j]``: the score of step ``j`` of ``paths[i]``; ``task``, ``ctx`` unused."""
        return [[check_step(step).score for step in path] for path in paths]
