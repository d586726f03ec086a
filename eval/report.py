"""Side-by-side reports of run directories: a markdown table and PNG plots.

For each dataset among the runs: accuracy against tokens per problem (one point
per run, 95% interval bars, the Pareto front of "more accurate for fewer
tokens" marked and connected) and, where problems have levels, accuracy per
difficulty level. Runs of a ``refinery tune`` profile (``DIR/runs/*``, beside
``DIR/profile.json``) have the profile's effort levels starred on the plot and
listed in a table of their own.

Example:
    >>> files = write_report(["runs/cot", "runs/sc8"], "docs", name="arith")  # doctest: +SKIP
    >>> files.markdown  # doctest: +SKIP
    'docs/arith.md'
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from refinery.engine.errors import InvalidRequestError
from refinery.eval.metrics import Accuracy, CostSummary, accuracy, cost_summary
from refinery.eval.results_file import read_results, snapshot
from refinery.eval.runner import CONFIG, RESULTS
from refinery.strategies.profile import PROFILE, Profile, pareto_front

__all__ = [
    "ReportFiles",
    "RunConfig",
    "RunReport",
    "load_run",
    "markdown_tables",
    "pareto_front",
    "plot_levels",
    "plot_pareto",
    "summarize_run",
    "write_report",
]


class RunReport(BaseModel):
    """The numbers of one run directory."""

    name: str
    path: str
    strategy: str
    dataset: str
    model: str
    n: int
    planned: int | None = None
    accuracy: Accuracy
    cost: CostSummary
    strict: Accuracy | None = None
    flexible: Accuracy | None = None
    levels: dict[int, Accuracy] = Field(default_factory=dict)
    effort: list[str] = Field(default_factory=list, description="the effort levels of a "
                              "tuned profile this run is (its dir in PROFILE_DIR/runs/)")


class ReportFiles(BaseModel):
    """Paths written by :func:`write_report`."""

    markdown: str
    images: list[str]


class DatasetInfo(BaseModel):
    """What a run's ``config.json`` says of its dataset."""

    name: str = "?"
    n_problems: int | None = None


class StrategyInfo(BaseModel):
    """What a run's ``config.json`` says of its strategy."""

    spec: str | None = None
    canonical: str | None = None
    worst_case_calls: int | None = None


class RunConfig(BaseModel):
    """The fields of a run's ``config.json`` a report (or the web page) reads, typed;
    the rest of the record is not read here."""

    model: str = "?"
    dataset: DatasetInfo = Field(default_factory=DatasetInfo)
    strategy: StrategyInfo = Field(default_factory=StrategyInfo)
    budget: Any = None  # a Budget's fields; checked by whoever applies it

    @classmethod
    def parse(cls, data: bytes | str) -> RunConfig:
        """A ``config.json``'s text as a :class:`RunConfig`.

        Raises:
            InvalidRequestError: not JSON, not an object, or a field of the wrong type.
        """
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequestError(f"{CONFIG} is not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise InvalidRequestError(f"{CONFIG} is a JSON {type(obj).__name__}, "
                                      "not an object")
        try:
            return cls.model_validate(obj)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise InvalidRequestError(f"{CONFIG}: {where}: {err['msg']}") from None

    @property
    def strategy_name(self) -> str:
        return self.strategy.canonical or self.strategy.spec or "?"


def load_run(path: str | Path) -> RunReport:
    """Summarise a run directory (``config.json`` + ``results.jsonl``).

    Raises:
        InvalidRequestError: not a run directory, or a file of it that cannot be read.
    """
    p = Path(path)
    cfg_path = p / CONFIG
    if not cfg_path.exists():
        raise InvalidRequestError(f"{p} is not a run directory (no {CONFIG})")
    cfg = RunConfig.parse(snapshot(cfg_path))
    report = summarize_run(p.name, str(p), cfg, read_results(p / RESULTS))
    return report.model_copy(update={"effort": effort_levels(p)})


def effort_levels(run_dir: Path) -> list[str]:
    """The levels a ``refinery tune`` profile maps to this run (it sits in ``DIR/runs/``
    beside ``DIR/profile.json``); none for any other run."""
    if not (run_dir.parent.parent / PROFILE).is_file():
        return []
    profile = Profile.load(run_dir.parent.parent)
    here = run_dir.resolve()
    return [name for name, i in profile.levels.items()
            if Path(profile.candidates[i].run).resolve() == here]


def summarize_run(name: str, path: str, cfg: RunConfig,
                  results: Sequence[Mapping[str, Any]]) -> RunReport:
    """The numbers of a run from its config and result rows (rows as
    :func:`~refinery.eval.results_file.parse_results` checked them; the first per id
    counts)."""
    rows, seen = [], set()
    for r in results:
        if r.get("id") not in seen:
            seen.add(r.get("id"))
            rows.append(r)
    strict_rows = [r["strict_match"] for r in rows if r.get("strict_match") is not None]
    flex_rows = [r["flexible_match"] for r in rows if r.get("flexible_match") is not None]
    by_level: dict[int, list[bool]] = defaultdict(list)
    for r in rows:
        if r.get("level") is not None:
            by_level[int(r["level"])].append(bool(r.get("passed")))
    return RunReport(
        name=name, path=path, strategy=cfg.strategy_name, dataset=cfg.dataset.name,
        model=cfg.model, n=len(rows), planned=cfg.dataset.n_problems,
        accuracy=accuracy(bool(r.get("passed")) for r in rows), cost=cost_summary(rows),
        strict=accuracy(strict_rows) if strict_rows else None,
        flexible=accuracy(flex_rows) if flex_rows else None,
        levels={lv: accuracy(v) for lv, v in sorted(by_level.items())})


def _pct(a: Accuracy) -> str:
    return f"{100 * a.value:.1f}% ({100 * a.low:.1f}–{100 * a.high:.1f})"


def _num(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def markdown_tables(runs: Sequence[RunReport]) -> str:
    """The main table, then GSM8K harness metrics and per-level accuracy where present."""
    out = ["| run | strategy | dataset | model | n | accuracy (95% CI) | tokens/problem | "
           "calls/problem | latency s/problem | wall s/problem | errors |",
           "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        n = f"{r.n}" if r.planned in (None, r.n) else f"{r.n} of {r.planned}"
        out.append(f"| {r.name} | `{r.strategy}` | {r.dataset} | {r.model} | {n} | "
                   f"{_pct(r.accuracy)} | {_num(r.cost.tokens)} | {_num(r.cost.calls, 2)} | "
                   f"{_num(r.cost.latency_seconds, 2)} | {_num(r.cost.wall_seconds, 2)} | "
                   f"{r.cost.errors} |")
    lm = [r for r in runs if r.strict is not None]
    if lm:
        out += ["", "GSM8K, scored as lm-evaluation-harness does on the full text:", "",
                "| run | strategy | strict-match | flexible-extract | refinery (math) |",
                "|---|---|---|---|---|"]
        for r in lm:
            out.append(f"| {r.name} | `{r.strategy}` | {_pct(r.strict)} | "
                       f"{_pct(r.flexible) if r.flexible else '–'} | {_pct(r.accuracy)} |")
    tuned = [r for r in runs if r.effort]
    if tuned:
        out += ["", "Effort levels of the tuned profile (points of the frontier):", "",
                "| level | run | strategy | accuracy (95% CI) | tokens/problem |",
                "|---|---|---|---|---:|"]
        out += [f"| {', '.join(r.effort)} | {r.name} | `{r.strategy}` | {_pct(r.accuracy)} | "
                f"{_num(r.cost.tokens)} |" for r in tuned]
    leveled = [r for r in runs if r.levels]
    if leveled:
        levels = sorted({lv for r in leveled for lv in r.levels})
        out += ["", "Accuracy by difficulty level (correct/n):", "",
                "| run | strategy | dataset | " + " | ".join(f"L{lv}" for lv in levels) + " |",
                "|---|---|---|" + "---:|" * len(levels)]
        for r in leveled:
            cells = [(f"{100 * r.levels[lv].value:.0f}% ({r.levels[lv].correct}/"
                      f"{r.levels[lv].n})" if lv in r.levels else "–") for lv in levels]
            out.append(f"| {r.name} | `{r.strategy}` | {r.dataset} | " + " | ".join(cells)
                       + " |")
    return "\n".join(out) + "\n"


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display (servers, CI)
    import matplotlib.pyplot as plt

    return plt


def _labels(runs: Sequence[RunReport]) -> list[str]:
    # The strategy names a point; runs sharing one (other model, other sampling) add their dir.
    counts: dict[str, int] = defaultdict(int)
    for r in runs:
        counts[r.strategy] += 1
    out = [r.strategy if counts[r.strategy] == 1 else f"{r.name}: {r.strategy}" for r in runs]
    return [s if len(s) <= 40 else s[:39] + "…" for s in out]


def _top(values: Sequence[float]) -> float:
    """The y-axis top: 0-100% would flatten a small model's few percent into the floor."""
    return min(102.0, max(10.0, 1.25 * max(values, default=100.0)))


def _label_lifts(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Upward label offsets, in points, that stack the labels of runs within 30% in
    tokens and 3 points of accuracy instead of printing them over each other."""
    lifts = [0] * len(xs)
    order = sorted(range(len(xs)), key=lambda i: (xs[i], ys[i]))
    for k, i in enumerate(order):
        near = [j for j in order[:k] if abs(ys[j] - ys[i]) < 3
                and max(xs[i], xs[j]) <= 1.3 * max(min(xs[i], xs[j]), 1e-9)]
        lifts[i] = 11 * len(near)
    return lifts


def plot_pareto(runs: Sequence[RunReport], path: str | Path, title: str = "") -> str:
    """Accuracy against tokens per problem, one point per run, Pareto front connected."""
    plt = _plt()
    xs = [r.cost.tokens for r in runs]
    ys = [100 * r.accuracy.value for r in runs]
    front = pareto_front(list(zip(xs, ys, strict=True)))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    err = [[100 * (r.accuracy.value - r.accuracy.low) for r in runs],
           [100 * (r.accuracy.high - r.accuracy.value) for r in runs]]
    ax.errorbar(xs, ys, yerr=err, fmt="o", color="tab:blue", ecolor="0.7", capsize=3,
                label="run (95% CI)", zorder=2)
    if front:
        ax.plot([xs[i] for i in front], [ys[i] for i in front], "-", color="tab:red",
                lw=1.5, zorder=3)
        ax.scatter([xs[i] for i in front], [ys[i] for i in front], s=110, facecolors="none",
                   edgecolors="tab:red", linewidths=1.8, label="Pareto front", zorder=4)
    for label, x, y, dy in zip(_labels(runs), xs, ys, _label_lifts(xs, ys), strict=True):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 6 + dy), fontsize=8)
    _mark_effort(ax, runs, xs, ys)
    if xs and min(xs) > 0 and max(xs) / min(xs) > 20:
        ax.set_xscale("log")
    ax.set_xlabel("tokens per problem (prompt + completion, all calls)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, _top([100 * r.accuracy.high for r in runs]))
    return _save(plt, fig, ax, title or "accuracy vs. cost", path)


def _mark_effort(ax: Any, runs: Sequence[RunReport], xs: Sequence[float],
                 ys: Sequence[float]) -> None:
    """A tuned profile's effort levels: a star on each chosen point, its level names below."""
    chosen = [i for i, r in enumerate(runs) if r.effort]
    if not chosen:
        return
    ax.scatter([xs[i] for i in chosen], [ys[i] for i in chosen], marker="*", s=160,
               color="tab:green", label="effort level", zorder=5)
    for i in chosen:
        ax.annotate("/".join(runs[i].effort), (xs[i], ys[i]), textcoords="offset points",
                    xytext=(6, -12), fontsize=8, color="tab:green", fontweight="bold")


def plot_levels(runs: Sequence[RunReport], path: str | Path, title: str = "") -> str:
    """Accuracy per difficulty level, one line per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for r, label in zip(runs, _labels(runs), strict=True):
        lv = sorted(r.levels)
        ax.plot(lv, [100 * r.levels[v].value for v in lv], "o-", label=label)
    levels = sorted({v for r in runs for v in r.levels})
    ax.set_xticks(levels)
    ax.set_xlabel("difficulty level")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(-2, _top([100 * v.value for r in runs for v in r.levels.values()]))
    return _save(plt, fig, ax, title or "accuracy by difficulty", path)


def _save(plt, fig, ax, title: str, path: str | Path) -> str:
    """Title, grid and legend as every plot here has them; write ``path``, free the figure."""
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s).strip("-") or "x"


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path, *, name: str = "report",
                 title: str | None = None) -> ReportFiles:
    """Write ``<out_dir>/<name>.md`` (tables + image links) and ``<out_dir>/img/*.png``.

    Raises:
        InvalidRequestError: no runs, or a path that is not a run directory.
    """
    if not run_dirs:
        raise InvalidRequestError("no run directories given")
    runs = [load_run(d) for d in run_dirs]
    out = Path(out_dir)
    img = out / "img"
    img.mkdir(parents=True, exist_ok=True)
    images: list[str] = []
    md = [f"# {title or 'Evaluation report'}", "", markdown_tables(runs)]
    by_dataset: dict[str, list[RunReport]] = defaultdict(list)
    for r in runs:
        by_dataset[r.dataset].append(r)
    for ds, group in by_dataset.items():
        base = f"{_slug(name)}-{_slug(ds)}"
        p = plot_pareto(group, img / f"{base}-pareto.png", f"{ds}: accuracy vs. tokens")
        images.append(p)
        md += [f"![{ds}: accuracy vs. tokens per problem](img/{Path(p).name})", ""]
        if any(r.levels for r in group):
            p = plot_levels([r for r in group if r.levels], img / f"{base}-levels.png",
                            f"{ds}: accuracy by difficulty")
            images.append(p)
            md += [f"![{ds}: accuracy by difficulty level](img/{Path(p).name})", ""]
    md_path = out / f"{_slug(name)}.md"
    md_path.write_text("\n".join(md))
    return ReportFiles(markdown=str(md_path), images=images)
