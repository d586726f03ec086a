"""Traces -> procedural memory (PMD): trajectories, checked lessons, recurring patterns.

:func:`build_memory` reads eval runs (verified against gold, as :func:`build`
does) and writes a :class:`~refinery.strategies.memory_store.MemoryStore`:

1. **trajectories**: every usable attempt with its strategy and verdict;
2. **lessons**: for a problem with a passing and a failing attempt, the policy
   (or ``teacher``, any OpenAI endpoint) is shown both and writes, in one
   sentence, the rule that separates them. A lesson is kept only if it changes
   a re-solve: ``solver`` (greedy) fails the problem without it and solves it
   with it in the prompt. One that changes nothing, or makes it worse, is dropped,
   and so is one that states an answer or names a number of its question,
   before it is tried: it would pass the re-solve by handing over the answer and
   teach nothing about other problems;
3. **patterns**: lessons of different problems that share their content words
   (Jaccard >= ``link``) are linked, and each connected group covering two or
   more problems becomes a pattern, named by its central lesson and shared
   words. Shared keywords rather than embeddings: the store must be readable
   and the clusters reproducible, and no embedding model runs beside the
   generator on a CPU machine (see :mod:`refinery.strategies.memory_store`).

Earlier rounds' store (``previous``) is carried forward, so round R's store
holds every lesson kept so far; each round writes its own directory.

Example:
    >>> stats = await build_memory(["runs/pmd/round-1/sample"],  # doctest: +SKIP
    ...                            "runs/pmd/round-1/memory", backend, round=1)
    >>> stats.lessons_kept, stats.patterns  # doctest: +SKIP
    (6, 1)
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import networkx as nx
from pydantic import BaseModel

from refinery.distill.candidates import Candidate, Problem, load_candidates
from refinery.distill.selection import build_rows
from refinery.engine.backends.base import Backend
from refinery.engine.run import solve_one
from refinery.engine.types import Message, SamplingParams, Task
from refinery.strategies.base import Strategy, with_note
from refinery.strategies.memory import NOTE
from refinery.strategies.memory_store import Lesson, MemoryStore, Pattern, Trajectory, keywords
from refinery.strategies.registry import build as build_strategy
from refinery.verifiers.math import is_equivalent

__all__ = ["MemoryStats", "build_memory", "cluster_patterns", "lesson_prompt", "names_the_problem"]

LESSON = ("Problem: {question}\n\nA correct solution:\n{good}\n\nA wrong solution:\n{bad}\n\n"
          "In one sentence, state the general rule the correct solution follows and the wrong "
          "one breaks. Do not use this problem's numbers.")


class MemoryStats(BaseModel):
    """What one :func:`build_memory` kept."""

    trajectories: int = 0
    mixed_problems: int = 0
    lessons_written: int = 0
    lessons_kept: int = 0
    lessons_unchanged: int = 0  # the re-solve came out the same with the lesson
    lessons_worse: int = 0  # solved without it, failed with it
    lessons_specific: int = 0  # stated an answer or the question's numbers: not a rule
    patterns: int = 0
    store: str = ""


def lesson_prompt(prob: Problem, good: Candidate, bad: Candidate) -> list[Message]:
    """The request that asks for one problem's lesson."""
    return [Message(role="user", content=LESSON.format(
        question=prob.prompt, good=good.text or good.raw, bad=bad.text or bad.raw))]


def _verified(runs: Sequence[str | Path]) -> list[Problem]:
    problems, stats = load_candidates(runs)
    build_rows(problems, stats)  # sets passed / drop on every candidate (rows unused)
    return problems


def _trajectories(problems: Sequence[Problem], round_: int) -> list[Trajectory]:
    return [Trajectory(problem_id=p.problem_id, question=p.prompt, strategy=c.strategy,
                       text=c.text or c.raw, answer=c.answer or c.executed,
                       passed=bool(c.passed), verifier=c.verifier or "run", round=round_)
            for p in problems for c in p.candidates
            if (c.drop is None and c.passed is not None) or c.drop == "failed_run"]


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# "The answer is 12", "the correct solution is \boxed{12}": an answer, of any problem.
_STATES_ANSWER = re.compile(r"\b(?:answer|solution|result)\s+(?:is|=|:)\s*\S*\d|\\boxed\{",
                            re.IGNORECASE)


def names_the_problem(lesson: str, question: str, gold: str) -> bool:
    """Whether ``lesson`` states an answer or a number of the question (not a general rule).

    Example:
        >>> names_the_problem("The answer is 46.", "Sam has 20 shells and gets 26.", "46")
        True
        >>> names_the_problem("Add what is gained.", "Sam has 20 shells and gets 26.", "46")
        False
    """
    if _STATES_ANSWER.search(lesson):
        return True
    numbers = set(_NUMBER.findall((question + " " + gold).replace(",", "")))
    return bool(numbers & set(_NUMBER.findall(lesson.replace(",", ""))))


def _first_sentence(text: str) -> str:
    line = next((x.strip() for x in text.strip().splitlines() if x.strip()), "")
    end = line.find(". ")
    return (line[: end + 1] if end > 0 else line)[:300]


async def _solves(solver: Strategy, question: str, gold: str, backend: Backend,
                  note: str | None, max_tokens: int) -> bool:
    task = Task.from_prompt(question)
    if note:
        task = with_note(task, NOTE.format(lessons=f"- {note}"))
    trace = await solve_one(solver, task, backend,
                            params=SamplingParams(temperature=0.0, max_tokens=max_tokens))
    answer = trace.attempt.answer if trace.attempt else None
    return answer is not None and is_equivalent(answer, gold)


def cluster_patterns(lessons: Sequence[Lesson], *, link: float = 0.34,
                     round_: int = 0) -> list[Pattern]:
    """Groups of lessons from two or more problems that share their content words."""
    words = [set(keywords(x.lesson)) for x in lessons]
    g = nx.Graph()
    g.add_nodes_from(range(len(lessons)))
    for i, j in itertools.combinations(range(len(lessons)), 2):
        union = words[i] | words[j]
        if (lessons[i].problem_id != lessons[j].problem_id and union
                and len(words[i] & words[j]) / len(union) >= link):
            g.add_edge(i, j)
    out = []
    for group in sorted(map(sorted, nx.connected_components(g))):
        if len({lessons[i].problem_id for i in group}) < 2:
            continue
        central = max(group, key=lambda i: (g.degree(i), -i))
        common = Counter(w for i in group for w in words[i])
        shared = [w for w, n in common.most_common() if n * 2 >= len(group)][:8]
        pid = hashlib.sha256("|".join(lessons[i].id for i in group).encode()).hexdigest()[:12]
        out.append(Pattern(id=f"p-{pid}", lesson=lessons[central].lesson, keywords=shared,
                           lessons=[lessons[i].id for i in group],
                           problems=len({lessons[i].problem_id for i in group}),
                           round=round_))
    return out


async def _lesson(prob: Problem, author: Backend, author_name: str, backend: Backend,
                  solver: Strategy, max_tokens: int, round_: int,
                  stats: MemoryStats) -> Lesson | None:
    """One problem's lesson, kept only if it turns a failed re-solve into a solved one."""
    usable = [c for c in prob.candidates if c.drop is None and c.passed is not None]
    good = next(c for c in usable if c.passed)
    bad = next(c for c in usable if not c.passed)
    [comp] = await author.generate(lesson_prompt(prob, good, bad),
                                   SamplingParams(temperature=0.0, max_tokens=96))
    text = _first_sentence(comp.text)
    if not text:
        return None
    stats.lessons_written += 1
    gold = prob.gold or ""
    if names_the_problem(text, prob.prompt, gold):
        stats.lessons_specific += 1
        return None
    without, with_it = await asyncio.gather(
        _solves(solver, prob.prompt, gold, backend, None, max_tokens),
        _solves(solver, prob.prompt, gold, backend, text, max_tokens))
    if with_it == without:
        stats.lessons_unchanged += 1
        return None
    if without:
        stats.lessons_worse += 1
        return None
    lid = hashlib.sha256(f"{prob.key}\x00{text}".encode()).hexdigest()[:12]
    return Lesson(id=f"l-{lid}", problem_id=prob.problem_id, question=prob.prompt,
                  lesson=text, author=author_name, round=round_)


async def build_memory(runs: Sequence[str | Path], out: str | os.PathLike[str],
                       backend: Backend, *, round: int = 0,  # noqa: A002 - the round number
                       previous: MemoryStore | None = None, teacher: Backend | None = None,
                       teacher_name: str = "teacher", solver: str = "cot",
                       max_lessons: int = 64, max_tokens: int = 384,
                       concurrency: int = 16) -> MemoryStats:
    """Write the store of ``runs`` (plus ``previous``) to ``out``; see the module docstring.

    ``backend`` serves the policy (it re-solves, and writes lessons when there is
    no ``teacher``); gold answers are used for the verdicts only.
    """
    prev = previous or MemoryStore()
    problems = [p for p in _verified(runs) if p.gold is not None]
    stats = MemoryStats(store=str(out))
    trajectories = _trajectories(problems, round)
    stats.trajectories = len(trajectories)
    mixed = [p for p in problems
             if len({bool(c.passed) for c in p.candidates
                     if c.drop is None and c.passed is not None}) == 2]
    stats.mixed_problems = len(mixed)
    author, name = (teacher, teacher_name) if teacher is not None else (backend, "policy")
    gate, re_solver = asyncio.Semaphore(concurrency), build_strategy(solver)

    async def one(p: Problem) -> Lesson | None:
        async with gate:
            return await _lesson(p, author, name, backend, re_solver, max_tokens, round, stats)

    kept = [x for x in await asyncio.gather(*(one(p) for p in mixed[:max_lessons])) if x]
    stats.lessons_kept = len(kept)
    lessons = prev.lessons + [x for x in kept if x.id not in {y.id for y in prev.lessons}]
    patterns = cluster_patterns(lessons, round_=round)
    stats.patterns = len(patterns)
    MemoryStore(trajectories=prev.trajectories + trajectories, lessons=lessons,
                patterns=patterns).save(out)
    return stats
