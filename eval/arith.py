"""``arith``: seeded arithmetic word problems in five levels of difficulty.

A benchmark a 135M model can move on: level 1 is one addition or subtraction,
level 5 five mixed steps. Its train and test splits never share a problem (a
problem's split is a function of its text).

Example:
    >>> ex = load_arith("test", limit=1)[0]
    >>> ex.dataset, ex.level, ex.verifier
    ('arith', 1, 'math')
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from refinery.eval.example import DatasetError, Example, Split

__all__ = ["ARITH_LEVELS", "load_arith"]

_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack",
          "Kara", "Leo", "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tara")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "coins", "books",
          "shells", "cards", "beads", "toy cars", "eggs", "balloons", "crayons", "buttons")
_ADD = ("{name} buys {k} more {item}.", "A friend gives {name} {k} more {item}.",
        "{name} finds {k} more {item}.", "{name} wins {k} {item} in a game.")
_SUB = ("{name} gives away {k} {item}.", "{name} loses {k} {item}.",
        "{name} sells {k} of the {item}.", "{name} uses up {k} {item}.")
_MUL = ("Then {name} ends up with {k} times as many {item} as before.",
        "Then the number of {item} {name} has becomes {k} times as large.")
_DIV = ("{name} splits the {item} equally into {k} bags and keeps only one bag.",
        "{name} makes {k} equal piles of the {item} and keeps just one pile.")

# level -> (number of steps, max start, max operand, allowed operations)
ARITH_LEVELS: dict[int, tuple[int, int, int, str]] = {
    1: (1, 20, 9, "+-"),
    2: (1, 60, 30, "+-*"),
    3: (2, 60, 30, "+-*"),
    4: (3, 100, 50, "+-*/"),
    5: (5, 200, 99, "+-*/"),
}
_TEST_SHARE = 5  # one problem in 5 belongs to the test split (decided by its text's hash)


def _split_of(prompt: str) -> Split:
    # Membership is a function of the text itself, so no seed or count can ever put
    # the same problem in both splits.
    h = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    return "test" if h % _TEST_SHARE == 0 else "train"


def _arith_problem(rng: random.Random, level: int) -> tuple[str, int, list[str]]:
    steps, max_start, max_k, ops = ARITH_LEVELS[level]
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(2, max_start)
    lines = [f"{name} has {value} {item}."]
    trail = []
    for _ in range(steps):
        op = rng.choice(ops)
        divisors = [d for d in range(2, 7) if value % d == 0 and value // d >= 1]
        if op == "/" and not divisors:
            op = "+"
        if op == "-" and value < 2:
            op = "+"
        if op == "*" and value > 400:
            op = "-"
        if op == "+":
            k = rng.randint(1, max_k)
            tmpl, value = rng.choice(_ADD), value + k
        elif op == "-":
            k = rng.randint(1, min(max_k, value - 1))
            tmpl, value = rng.choice(_SUB), value - k
        elif op == "*":
            k = rng.randint(2, 3 if level >= 4 else 4)
            tmpl, value = rng.choice(_MUL), value * k
        else:
            k = rng.choice(divisors)
            tmpl, value = rng.choice(_DIV), value // k
        trail.append(f"{op}{k}")
        lines.append(tmpl.format(name=name, item=item, k=k))
    lines.append(f"How many {item} does {name} have now?")
    return " ".join(lines), value, trail


def load_arith(split: Split = "test", *, limit: int | None = None, seed: int = 0,
               levels: Sequence[int] = (1, 2, 3, 4, 5), size: int = 500) -> list[Example]:
    """Seeded arithmetic word problems, levels interleaved ``1, 2, ..., 5, 1, 2, ...``.

    Level 1 is one addition or subtraction with numbers below 30; level 5 is five
    mixed steps (add, subtract, multiply, exact division) with numbers in the
    hundreds. The j-th problem of a level depends only on (seed, split, level, j),
    so a smaller ``limit`` is a prefix of a larger one. A problem's split is a
    function of its text (hash), and problems are de-duplicated, so train and
    test never overlap.

    Example:
        >>> [e.level for e in load_arith(limit=6)]
        [1, 2, 3, 4, 5, 1]
    """
    if split not in ("train", "test"):
        raise DatasetError(f"arith split must be train or test, not {split!r}")
    levels = list(levels)
    bad = [lv for lv in levels if lv not in ARITH_LEVELS]
    if not levels or bad:
        raise DatasetError(f"arith levels must be in 1..5, got {levels}")
    n = size if limit is None else limit
    if n < 0:
        raise DatasetError(f"limit must be >= 0, got {n}")
    streams = {lv: random.Random(f"arith/{seed}/{split}/{lv}") for lv in levels}
    made = {lv: 0 for lv in levels}
    seen: set[str] = set()
    out = []
    for i in range(n):
        lv = levels[i % len(levels)]
        for _ in range(10_000):
            prompt, answer, trail = _arith_problem(streams[lv], lv)
            if prompt not in seen and _split_of(prompt) == split:
                break
        else:  # pragma: no cover - the level's space is far larger than any limit
            raise DatasetError(f"arith level {lv} ran out of distinct problems")
        seen.add(prompt)
        out.append(Example(id=f"arith-{split}-s{seed}-L{lv}-{made[lv]}", prompt=prompt,
                           gold=str(answer), verifier="math", dataset="arith", level=lv,
                           private={"steps": trail}))
        made[lv] += 1
    return out
