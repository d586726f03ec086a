"""``refinery tune``: measure candidate strategies on dev data and write a profile.

Each candidate (a spec and the run temperature it is measured at) is an ordinary
eval run in ``OUT/runs/<candidate>/``, so a rerun resumes it and a finished one
costs nothing; a run directory elsewhere with the same configuration (``adopt``,
e.g. ``runs/m60``) is copied in instead of rerun. From the runs' per-problem
outcomes tune builds the :class:`~refinery.strategies.profile.Profile` (frontier,
effort levels) and fits its router, then writes ``OUT/profile.json``.

Only dev data is measured: ``split="test"`` is refused (it is for the final eval),
and a custom JSONL gives its first ``dev_share`` of problems (the rest is held
back: evaluate it with ``--skip``).

The router is one logistic regression per candidate ("does it solve this
question?") on :func:`~refinery.strategies.profile.question_features`, fitted by
Newton's method in plain numpy: no new dependency, the same runs always give the
same weights (zero start, fixed iterations, no sampling), and the weights in
``profile.json`` can be read off one by one.

Example:
    >>> profile = await tune(TuneConfig(dataset="arith", limit=16, out="profiles/arith",
    ...                                 spec=["cot", "pot", "sc(pot, n=4)"]))  # doctest: +SKIP
    >>> candidate_of("sc(pot, n=4)"), candidate_of("cot@0.3")
    (Candidate(spec='sc(pot, n=4)', temperature=0.7), Candidate(spec='cot', temperature=0.3))
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field, field_validator

from refinery.engine.backends.base import Backend
from refinery.engine.backends.factory import make_backend
from refinery.engine.errors import InvalidRequestError
from refinery.engine.models import DEFAULT_MODEL
from refinery.eval.datasets import load_dataset
from refinery.eval.example import Example, Split
from refinery.eval.guarded import build_strategy
from refinery.eval.metrics import cost_summary
from refinery.eval.results_file import read_results
from refinery.eval.run_dir import CONFIG, RESULTS, TRACES, run_record
from refinery.eval.runner import EvalConfig, RunSummary, backend_spec, run_eval
from refinery.strategies.base import SampledParams
from refinery.strategies.profile import (
    Candidate,
    CandidateStats,
    Profile,
    Router,
    question_features,
)
from refinery.strategies.registry import REGISTRY
from refinery.strategies.spec import to_spec

__all__ = ["DEFAULT_CANDIDATES", "TuneConfig", "candidate_of", "fit_router", "tune"]

SAMPLED_TEMPERATURE = 0.7
DEFAULT_CANDIDATES: dict[str, tuple[str, ...]] = {
    "math": ("cot", "pot", "tir", "sc(pot, n=4)", "sc(cot, n=4)"),
    "code": ("cot", "self_debug(cot)"),
    "text": ("cot", "sc(cot, n=4)"),
}
Runner = Callable[..., Awaitable[RunSummary]]


def candidate_of(text: str) -> Candidate:
    """``SPEC[@TEMPERATURE]``; without a temperature a sampling strategy (sc, best_of_n)
    runs at 0.7 and any other greedily."""
    spec, sep, temp = text.rpartition("@") if "@" in text else (text, "", "")
    if sep:
        try:
            return Candidate(spec=spec.strip(), temperature=float(temp))
        except ValueError:
            raise InvalidRequestError(f"--spec {text!r}: the temperature after @ must be a "
                                      "number in [0, 2]") from None
    _, graph = build_strategy(spec)
    params = graph.nodes[graph.graph["root"]].get("params")
    sampled = isinstance(params, SampledParams)
    return Candidate(spec=spec.strip(), temperature=SAMPLED_TEMPERATURE if sampled else 0.0)


class TuneConfig(BaseModel):
    """What ``refinery tune`` measures, and where it writes the runs and the profile."""

    dataset: str
    out: str = Field(description="profile directory: OUT/profile.json, OUT/runs/<candidate>")
    spec: list[str] = Field(default_factory=list, description="candidate SPEC[@TEMPERATURE] "
                            "(repeatable; default: the task kind's list)")
    split: Split = "train"
    limit: int | None = Field(200, ge=1)
    dev_share: float = Field(0.2, gt=0.0, lt=1.0, description="custom JSONL: the share of "
                             "its problems (the first ones) measured as dev data")
    model: str = DEFAULT_MODEL
    max_tokens: int = Field(512, ge=1)
    data_path: str | None = None
    fields: dict[str, str] = Field(default_factory=dict)
    verifier: str | None = None
    seed: int = 0
    levels: list[int] | None = None
    target: Literal["low", "medium", "high"] = Field(
        "medium", description="the level whose dev accuracy the router aims at per question")
    adopt: list[str] = Field(default_factory=list, description="directory whose run dirs of "
                             "the same configuration are copied in instead of rerun "
                             "(repeatable)")
    concurrency: int = Field(64, ge=1)
    backend: Literal["vllm", "openai", "vllm-server"] = "vllm"
    base_url: list[str] = Field(default_factory=list)
    dtype: str = "auto"

    @field_validator("split")
    @classmethod
    def _dev_only(cls, split: str) -> str:
        if split == "test":
            raise ValueError("tune measures dev data (train); the test split is for the "
                             "final eval of the profile")
        return split

    def custom(self) -> bool:
        return Path(self.dataset).suffix == ".jsonl"

    def eval_config(self, candidate: Candidate, limit: int | None) -> EvalConfig:
        same = {k: getattr(self, k) for k in ("dataset", "split", "model", "max_tokens",
                                              "data_path", "fields", "verifier", "seed",
                                              "levels", "concurrency", "backend",
                                              "base_url", "dtype")}
        return EvalConfig(strategy=candidate.spec, temperature=candidate.temperature,
                          limit=limit, out=str(Path(self.out) / "runs" / candidate.key),
                          **same)


def _kind(examples: Sequence[Example]) -> str:
    verifiers = {e.verifier for e in examples}
    if "code" in verifiers:
        return "code"
    return "math" if verifiers <= {"math", "gsm8k"} else "text"


def _candidates(config: TuneConfig, examples: Sequence[Example]) -> list[Candidate]:
    specs = list(config.spec) or list(DEFAULT_CANDIDATES[_kind(examples)])
    if not config.spec and "cascade" in REGISTRY:
        specs.append("cascade")
    return [candidate_of(s) for s in specs]


def _dev_examples(config: TuneConfig) -> tuple[list[Example], int | None]:
    """The dev problems, and the ``limit`` their eval runs take."""
    load = {"split": config.split, "data_path": config.data_path, "seed": config.seed,
            "fields": config.fields or None, "verifier": config.verifier,
            "levels": config.levels}
    if not config.custom():
        examples = load_dataset(config.dataset, limit=config.limit, **load)
        return examples, config.limit
    every = load_dataset(config.dataset, **load)
    dev = max(1, math.floor(len(every) * config.dev_share))
    limit = dev if config.limit is None else min(dev, config.limit)
    return every[:limit], limit


def _identity(cfg: EvalConfig, examples: list[Example]) -> dict[str, Any]:
    _, graph = build_strategy(cfg.strategy)
    return run_record(cfg, to_spec(graph), graph, examples)["identity"]


def _recorded(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / CONFIG).read_text(encoding="utf-8")).get("identity")
    except (OSError, ValueError, AttributeError):
        return None


def _finished(run_dir: Path, identity: dict[str, Any], examples: list[Example]) -> bool:
    if _recorded(run_dir) != identity:
        return False
    ids = {r.get("id") for r in read_results(run_dir / RESULTS)}
    return {e.id for e in examples} <= ids


def _adopt(run_dir: Path, identity: dict[str, Any], sources: Sequence[str]) -> str | None:
    """Copy in a run of the same identity from ``sources`` (dirs or their children)."""
    if (run_dir / CONFIG).exists():
        return None
    for source in map(Path, sources):
        for found in [source, *sorted(p for p in source.glob("*") if p.is_dir())]:
            if _recorded(found) == identity:
                run_dir.mkdir(parents=True, exist_ok=True)
                for name in (CONFIG, RESULTS, TRACES):
                    if (found / name).exists():
                        shutil.copy2(found / name, run_dir / name)
                return str(found)
    return None


async def tune(config: TuneConfig, *, backend: Backend | None = None,
               run: Runner = run_eval, progress: bool = False) -> Profile:
    """Run (or resume, or adopt) each candidate's dev run; write and return the profile.

    ``backend`` is shared by every run (default: one started here, only if a run has
    problems left); ``run`` is the eval runner (a seam for tests).
    """
    examples, limit = _dev_examples(config)
    candidates = _candidates(config, examples)
    configs = [config.eval_config(c, limit) for c in candidates]
    identities = [_identity(cfg, examples) for cfg in configs]
    for cfg, identity in zip(configs, identities, strict=True):
        _adopt(Path(cfg.out), identity, config.adopt)
    todo = [cfg for cfg, identity in zip(configs, identities, strict=True)
            if not _finished(Path(cfg.out), identity, examples)]
    own = backend is None and bool(todo)
    if own:
        backend = await make_backend(backend_spec(configs[0]))
    try:
        for cfg in todo:
            await run(cfg, backend=backend, progress=progress)
    finally:
        if own and backend is not None:
            await backend.aclose()
    profile = _profile(config, candidates, [Path(c.out) for c in configs], examples)
    profile.save(config.out)
    return profile


def _rows(run_dir: Path, examples: list[Example]) -> list[dict[str, Any]]:
    by_id: dict[str, dict[str, Any]] = {}
    for r in read_results(run_dir / RESULTS):
        by_id.setdefault(r.get("id"), r)
    return [by_id[e.id] for e in examples if e.id in by_id]


def _profile(config: TuneConfig, candidates: list[Candidate], run_dirs: list[Path],
             examples: list[Example]) -> Profile:
    rows = [_rows(d, examples) for d in run_dirs]
    stats = []
    for c, d, rs in zip(candidates, run_dirs, rows, strict=True):
        cost = cost_summary(rs)
        stats.append(CandidateStats.of(c, (r.get("passed") for r in rs), tokens=cost.tokens,
                                       calls=cost.calls, seconds=cost.latency_seconds,
                                       run=str(d)))
    cascade = next((i for i, c in enumerate(candidates) if c.spec.startswith("cascade")), None)
    profile = Profile.build(config.dataset, config.model, stats, fallback=cascade)
    router = fit_router(examples, rows, [s.tokens for s in stats],
                        profile.level(config.target).accuracy, profile.fallback)
    return profile.model_copy(update={"router": router})


def fit_router(examples: Sequence[Example], rows: Sequence[Sequence[dict[str, Any]]],
               tokens: Sequence[float], threshold: float, fallback: int,
               l2: float = 1.0, iterations: int = 25) -> Router | None:
    """One L2-regularised logistic regression per candidate on the problems every
    candidate has a row for; None when there are fewer than 8 such problems."""
    passed = [{r["id"]: bool(r.get("passed")) for r in rs} for rs in rows]
    ids = [e.id for e in examples if all(e.id in p for p in passed)]
    if len(ids) < 8:
        return None
    prompts = {e.id: e.prompt for e in examples}
    x = np.array([question_features(prompts[i]) for i in ids], dtype=float)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale[scale == 0] = 1.0
    design = np.hstack([np.ones((len(ids), 1)), (x - mean) / scale])
    weights = [_logistic(design, np.array([p[i] for i in ids], dtype=float), l2, iterations)
               for p in passed]
    order = sorted(range(len(tokens)), key=lambda i: (tokens[i], i))
    return Router(mean=mean.round(6).tolist(), scale=scale.round(6).tolist(),
                  weights=[w.round(6).tolist() for w in weights], order=order,
                  threshold=round(threshold, 6), fallback=fallback)


def _logistic(design: np.ndarray, y: np.ndarray, l2: float, iterations: int) -> np.ndarray:
    """Newton's method from zero weights (the bias barely penalised)."""
    w = np.zeros(design.shape[1])
    penalty = np.eye(design.shape[1]) * l2
    penalty[0, 0] = 1e-3 * l2  # barely: a candidate that always (never) passes stays finite
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -40, 40)))
        grad = design.T @ (p - y) + penalty @ w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + penalty + 1e-9 * np.eye(len(w))
        w = w - np.linalg.solve(hess, grad)
    return w

