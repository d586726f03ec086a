"""Procedural memory on disk: trajectories, lessons and patterns, and their retrieval.

A store is a directory of three JSONL files, each line one pydantic model, so a
person can read and edit it:

- ``trajectories.jsonl``: attempts with their strategy and verifier outcome
  (:class:`Trajectory`);
- ``lessons.jsonl``: what separated a passing attempt from a failing one on one
  problem, kept only when a re-solve with it went right where one without it
  went wrong (:class:`Lesson`);
- ``patterns.jsonl``: lessons that recur across problems (:class:`Pattern`).

:meth:`MemoryStore.retrieve` ranks lessons and patterns for a question by
Okapi BM25 over their words (the question a lesson came from counts, so a
lesson surfaces for questions like its own). BM25 and not embeddings: the only
model on a CPU machine is the generator, lexical overlap is what arith and
GSM8K questions of one kind share (the same verbs, units and quantities), and
the ranking is deterministic and inspectable.

Example:
    >>> import tempfile
    >>> lessons = [Lesson(id="l1", problem_id="p1", question="Ava has 5 apples and buys 3.",
    ...                   lesson="Add what is bought to what one has.", author="m"),
    ...            Lesson(id="l2", problem_id="p2", question="A box holds 6 eggs. 4 boxes?",
    ...                   lesson="Multiply the eggs per box by the boxes.", author="m")]
    >>> directory = tempfile.TemporaryDirectory()
    >>> MemoryStore(lessons=lessons).save(directory.name)
    >>> store = MemoryStore.load(directory.name)
    >>> store.retrieve("Ben has 2 apples and buys 4 more. How many?", k=3)
    ['Add what is bought to what one has.']
    >>> directory.cleanup()
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, Field, ValidationError

from refinery.engine.errors import SpecError

__all__ = ["Lesson", "MemoryStore", "Pattern", "Trajectory", "bm25_rank", "keywords"]

FILES = {"trajectories": "trajectories.jsonl", "lessons": "lessons.jsonl",
         "patterns": "patterns.jsonl"}
_STOP = frozenset(
    "the a an and or of to in on for is are was were be by with that this it its as at "
    "from if then than so not no do does did has have had what how many much each one "
    "more less you your they their there which who when where will would can could "
    "should must into out up down all any some only also just about after before".split())


class Trajectory(BaseModel):
    """One attempt at a problem and what the verifier said of it."""

    problem_id: str
    question: str
    strategy: str
    text: str
    answer: str | None = None
    passed: bool
    verifier: str = ""
    round: int = 0


class Lesson(BaseModel):
    """What made the difference on one problem, checked by a re-solve."""

    id: str
    problem_id: str
    question: str
    lesson: str
    author: str = Field(description="the model that wrote it (the policy or a teacher)")
    round: int = 0


class Pattern(BaseModel):
    """A lesson that recurs across problems: the cluster's words and its central lesson."""

    id: str
    lesson: str
    keywords: list[str]
    lessons: list[str] = Field(description="ids of the lessons in the cluster")
    problems: int = Field(ge=2)
    round: int = 0


def keywords(text: str) -> list[str]:
    """The content words of ``text``, lower-cased, in order (numbers left out)."""
    return [w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2 and w not in _STOP]


def bm25_rank(query: str, docs: Sequence[str], k: int, *, k1: float = 1.2,
              b: float = 0.75) -> list[int]:
    """Indices of the ``k`` best ``docs`` for ``query`` by Okapi BM25 (score > 0 only)."""
    toks = [keywords(d) for d in docs]
    if not toks:
        return []
    avg = sum(map(len, toks)) / len(toks) or 1.0
    df = Counter(w for t in toks for w in set(t))
    q = set(keywords(query))
    scores = []
    for i, t in enumerate(toks):
        tf, s = Counter(t), 0.0
        for w in q & tf.keys():
            idf = math.log(1 + (len(toks) - df[w] + 0.5) / (df[w] + 0.5))
            s += idf * tf[w] * (k1 + 1) / (tf[w] + k1 * (1 - b + b * len(t) / avg))
        scores.append((s, -i))
    best = sorted(((s, i) for s, i in scores if s > 0), reverse=True)[:k]
    return [-i for _, i in best]


M = TypeVar("M", bound=BaseModel)


def _read(path: Path, model: type[M]) -> list[M]:
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(model.model_validate_json(line))
            except ValidationError as e:
                raise SpecError(f"{path}:{n}: not a {model.__name__}: "
                                f"{e.errors()[0]['msg']}") from None
    return out


class MemoryStore(BaseModel):
    """The three levels of procedural memory, read from and written to a directory.

    Example:
        >>> store = MemoryStore(lessons=[Lesson(id="l1", problem_id="p", question="...",
        ...                                     lesson="Multiply before adding.", author="m")])
        >>> store.save("runs/pmd/round-1/memory")  # doctest: +SKIP
        >>> [lesson.lesson for lesson in store.lessons]
        ['Multiply before adding.']
    """

    trajectories: list[Trajectory] = Field(default_factory=list)
    lessons: list[Lesson] = Field(default_factory=list)
    patterns: list[Pattern] = Field(default_factory=list)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> MemoryStore:
        d = Path(directory)
        if not d.is_dir():
            raise SpecError(f"memory store {str(d)!r} is not a directory")
        return cls(trajectories=_read(d / FILES["trajectories"], Trajectory),
                   lessons=_read(d / FILES["lessons"], Lesson),
                   patterns=_read(d / FILES["patterns"], Pattern))

    def save(self, directory: str | os.PathLike[str]) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        for field, name in FILES.items():
            rows = getattr(self, field)
            tmp = d / f".{name}.tmp"
            tmp.write_text("".join(r.model_dump_json() + "\n" for r in rows), encoding="utf-8")
            os.replace(tmp, d / name)

    def retrieve(self, question: str, k: int = 3) -> list[str]:
        """The texts of the ``k`` lessons and patterns most relevant to ``question``."""
        texts = [p.lesson for p in self.patterns] + [x.lesson for x in self.lessons]
        docs = ([f"{' '.join(p.keywords)} {p.lesson}" for p in self.patterns]
                + [f"{x.question} {x.lesson}" for x in self.lessons])
        seen: list[str] = []
        for i in bm25_rank(question, docs, k * 2):
            if texts[i] not in seen:
                seen.append(texts[i])
        return seen[:k]


@lru_cache(maxsize=8)
def _cached(path: str, stamp: tuple[float, ...]) -> MemoryStore:
    return MemoryStore.load(path)


def load_store(directory: str) -> MemoryStore:
    """The store at ``directory``, read again only when one of its files changed."""
    d = Path(directory)
    stamp = tuple((d / n).stat().st_mtime if (d / n).exists() else 0.0 for n in FILES.values())
    return _cached(str(d.resolve()), stamp)
