"""A tuned profile: what each candidate strategy solved on dev data and what it cost,
the accuracy-tokens Pareto frontier, effort levels on it, and a per-question router.

``refinery tune`` (:mod:`refinery.eval.tune`) measures the candidates and writes
``profile.json``; the ``auto`` strategy and the server read it. It sits in the
strategies layer so both can, which is also why the Wilson interval and the Pareto
sweep live here (the eval metrics and reports import them from this one home).

Effort levels are points of the frontier, so a higher level is never less accurate
on the dev data: ``low`` is the cheapest frontier point, ``high`` the most accurate,
``medium`` the cheapest whose accuracy lies inside ``high``'s 95% interval (as good
as the best within what the dev data can tell apart).

Example:
    >>> stats = [CandidateStats.of(Candidate(spec="cot"), [True, False, False, False],
    ...                            tokens=100, calls=1, seconds=1.0),
    ...          CandidateStats.of(Candidate(spec="pot"), [True, True, True, False],
    ...                            tokens=150, calls=1, seconds=1.0),
    ...          CandidateStats.of(Candidate(spec="sc(pot, n=4)", temperature=0.7),
    ...                            [True, True, True, True], tokens=900, calls=4, seconds=3.0)]
    >>> p = Profile.build("arith", "smollm2-135m", stats)
    >>> p.frontier, p.levels
    ([0, 1, 2], {'low': 0, 'medium': 1, 'high': 2})
    >>> [round(x, 4) for x in wilson_interval(0, 10)]
    [0.0, 0.2775]
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from refinery.engine.errors import InvalidRequestError

__all__ = ["FEATURES", "LEVELS", "PROFILE", "SHIPPED", "Candidate", "CandidateStats", "Profile",
           "Router", "pareto_front", "question_features", "wilson_interval"]

PROFILE = "profile.json"
LEVELS = ("low", "medium", "high")
# Profiles of the embedded model measured by `refinery tune` (docs/results.md), one
# directory per task: what the server's effort levels run when no --profile is given.
SHIPPED = Path(__file__).parent / "profiles"
Z95 = statistics.NormalDist().inv_cdf(0.975)  # 1.95996...


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0/n
    and n/n, which small benchmark runs hit often.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: ``(cost, accuracy)``, lower cost and
    higher accuracy better; returned in order of increasing cost.

    Example:
        >>> pareto_front([(100, 0.5), (200, 0.4), (300, 0.7)])
        [0, 2]
    """
    # One sweep in order of cost (then accuracy, best first), n log n: a point is on the
    # front when it is more accurate than every cheaper one, or repeats the last point.
    front: list[int] = []
    best = float("-inf")
    for i in sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1])):
        if points[i][1] > best or (front and points[i] == points[front[-1]]):
            front.append(i)
            best = max(best, points[i][1])
    return front


# Words that name an arithmetic operation; their count says how many steps a question has.
_OPERATION = re.compile(r"\b(times|twice|double|triple|half|more|less|fewer|each|every|per|"
                        r"total|sum|difference|product|divided?|split|share|percent|%|"
                        r"remain\w*|left|gives?|gave|sells?|sold|buys?|bought|loses?|lost)\b",
                        re.IGNORECASE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_CODE = re.compile(r"```|\bdef |\breturn\b|\bclass |\bimport |[{};]")
_MATH = re.compile(r"\\[a-z]+|\$|\^|=|\\frac|\bsqrt\b")
FEATURES = ("log_chars", "words", "numbers", "max_digits", "mean_digits", "operations",
            "code_marks", "math_marks")


def question_features(question: str) -> list[float]:
    """Cheap features of a question, in :data:`FEATURES` order.

    Example:
        >>> question_features("Emma has 8 balloons. Emma sells 2 of them. How many now?")
        [4.0431, 12.0, 2.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    """
    numbers = _NUMBER.findall(question)
    digits = [len(re.sub(r"\D", "", x)) for x in numbers]
    values = [math.log1p(len(question)), len(question.split()), len(numbers),
              max(digits, default=0), sum(digits) / len(digits) if digits else 0.0,
              len(_OPERATION.findall(question)), len(_CODE.findall(question)),
              len(_MATH.findall(question))]
    return [round(float(v), 4) for v in values]


class Candidate(BaseModel):
    """A strategy spec and the run temperature it was measured (and is run) at."""

    spec: str
    temperature: float = Field(0.0, ge=0.0, le=2.0)

    @property
    def key(self) -> str:
        """A file name for its run directory: ``sc-pot-n-4-T0.7``."""
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.spec).strip("-") or "spec"
        return f"{slug}-T{self.temperature:g}"


class CandidateStats(BaseModel):
    """One candidate on the dev data: accuracy with its 95% Wilson interval and the
    mean cost per problem, plus the run directory the numbers come from."""

    candidate: Candidate
    run: str = ""
    n: int
    correct: int
    accuracy: float
    low: float
    high: float
    tokens: float
    calls: float
    seconds: float

    @classmethod
    def of(cls, candidate: Candidate, passed: Iterable[bool], *, tokens: float, calls: float,
           seconds: float, run: str = "") -> CandidateStats:
        flags = [bool(p) for p in passed]
        k, n = sum(flags), len(flags)
        lo, hi = wilson_interval(k, n)
        return cls(candidate=candidate, run=run, n=n, correct=k, accuracy=k / n if n else 0.0,
                   low=lo, high=hi, tokens=tokens, calls=calls, seconds=seconds)


class Router(BaseModel):
    """Per candidate, a logistic model of "this candidate solves the question" on
    standardised :func:`question_features`; a question goes to the cheapest candidate
    whose predicted chance reaches ``threshold`` (the dev accuracy of the profile's
    target level), else to ``fallback``."""

    features: list[str] = Field(default_factory=lambda: list(FEATURES))
    mean: list[float]
    scale: list[float]
    weights: list[list[float]]  # per candidate: bias first, then one per feature
    order: list[int]  # candidates by tokens per problem, cheapest first
    threshold: float
    fallback: int

    def chances(self, question: str) -> list[float]:
        """The predicted chance of each candidate to solve ``question``."""
        x = [(v - m) / s for v, m, s in zip(question_features(question), self.mean,
                                             self.scale, strict=True)]
        out = []
        for w in self.weights:
            z = w[0] + sum(a * b for a, b in zip(w[1:], x, strict=True))
            out.append(1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z)))))
        return out

    def choose(self, question: str) -> int:
        """The candidate index ``question`` goes to."""
        chances = self.chances(question)
        return next((i for i in self.order if chances[i] >= self.threshold), self.fallback)


class Profile(BaseModel):
    """What ``refinery tune`` measured, and the choices made from it."""

    dataset: str
    model: str
    candidates: list[CandidateStats]
    frontier: list[int]  # candidate indices, cheapest first
    levels: dict[str, int]  # low / medium / high -> candidate index (on the frontier)
    fallback: int  # where the router sends a question it is unsure of
    router: Router | None = None

    @classmethod
    def build(cls, dataset: str, model: str, stats: Sequence[CandidateStats],
              fallback: int | None = None) -> Profile:
        """The frontier and levels of ``stats``; ``fallback`` defaults to ``high``."""
        if not stats:
            raise InvalidRequestError("a profile needs at least one candidate")
        frontier = pareto_front([(s.tokens, s.accuracy) for s in stats])
        frontier = [i for k, i in enumerate(frontier)  # a repeated point once
                    if k == 0 or stats[i].accuracy > stats[frontier[k - 1]].accuracy]
        high = frontier[-1]
        medium = next(i for i in frontier if stats[i].accuracy >= stats[high].low)
        levels = {"low": frontier[0], "medium": medium, "high": high}
        return cls(dataset=dataset, model=model, candidates=list(stats), frontier=frontier,
                   levels=levels, fallback=high if fallback is None else fallback)

    def level(self, name: str) -> CandidateStats:
        if name not in self.levels:
            raise InvalidRequestError(f"unknown effort level {name!r}; use one of "
                                      + ", ".join(LEVELS))
        return self.candidates[self.levels[name]]

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / PROFILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, directory: str | Path) -> Profile:
        """The profile in ``directory`` (or the ``profile.json`` path itself).

        Raises:
            InvalidRequestError: no profile there, or not one.
        """
        path = Path(directory)
        path = path if path.suffix == ".json" else path / PROFILE
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InvalidRequestError(f"no profile at {path} ({exc.strerror}); "
                                      "write one with `refinery tune`") from None
        except ValueError as exc:
            raise InvalidRequestError(f"{path} is not a profile: {exc}") from None
