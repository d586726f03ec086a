"""Accuracy against tokens per problem as SVG geometry, drawn by a template.

The same picture as ``refinery eval report``'s PNG (one point per run, 95%
interval bars, the Pareto front connected; a log x axis when tokens span more
than 20x), computed here as pixel coordinates so the page needs no plotting
library and no script.

Example:
    >>> runs = [load_run("runs/cot"), load_run("runs/sc8")]  # doctest: +SKIP
    >>> plot = accuracy_plot(runs, ["cot", "sc8"], "arith")  # doctest: +SKIP
    >>> [p.front for p in plot.points]  # sc8: more accurate for more tokens  # doctest: +SKIP
    [True, True]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel

from refinery.eval.report import RunReport, pareto_front

WIDTH, HEIGHT = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 56, 24, 16, 44  # margins: axis labels left and below


class PlotPoint(BaseModel):
    """One run: its place, its interval bar's ends, its label, whether it is on the front."""

    x: float
    y: float
    low: float
    high: float
    label: str
    run: str
    front: bool


class Tick(BaseModel):
    at: float
    label: str


class Plot(BaseModel):
    """What the template draws: the frame, the points, the front as polyline points, ticks."""

    title: str
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM
    points: list[PlotPoint]
    front: str
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    log_x: bool


def accuracy_plot(runs: Sequence[RunReport], names: Sequence[str], title: str) -> Plot:
    """The plot of ``runs`` (``names``: how each run is linked to)."""
    xs = [max(r.cost.tokens, 1e-9) for r in runs]
    log_x = min(xs) > 0 and max(xs) / min(xs) > 20
    tx = [math.log10(x) for x in xs] if log_x else xs
    lo, hi = min(tx), max(tx)
    pad = (hi - lo) * 0.08 or (abs(hi) * 0.5 or 1.0)
    lo, hi = (lo - pad, hi + pad) if log_x else (max(0.0, lo - pad), hi + pad)
    top = min(1.02, max(0.1, 1.25 * max(r.accuracy.high for r in runs)))

    def px(t: float) -> float:
        return round(LEFT + (t - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT), 1)

    def py(v: float) -> float:
        return round(HEIGHT - BOTTOM - v / top * (HEIGHT - TOP - BOTTOM), 1)

    front = set(pareto_front(list(zip(xs, [r.accuracy.value for r in runs], strict=True))))
    points = [PlotPoint(x=px(t), y=py(r.accuracy.value), low=py(r.accuracy.low),
                        high=py(r.accuracy.high), label=r.strategy, run=name, front=i in front)
              for i, (t, r, name) in enumerate(zip(tx, runs, names, strict=True))]
    line = sorted((p for p in points if p.front), key=lambda p: p.x)
    return Plot(title=title, points=points, front=" ".join(f"{p.x},{p.y}" for p in line),
                x_ticks=_x_ticks(lo, hi, log_x, px), y_ticks=_y_ticks(top, py), log_x=log_x)


def _x_ticks(lo: float, hi: float, log_x: bool, px) -> list[Tick]:
    if log_x:
        return [Tick(at=px(e), label=f"{10 ** e:,.0f}")
                for e in range(math.ceil(lo), math.floor(hi) + 1)]
    step = _nice_step((hi - lo) / 5)
    first = math.ceil(lo / step) * step
    count = int((hi - first) / step) + 1
    return [Tick(at=px(first + i * step), label=f"{first + i * step:,.0f}")
            for i in range(count)]


def _y_ticks(top: float, py) -> list[Tick]:
    step = _nice_step(top / 5)
    return [Tick(at=py(i * step), label=f"{100 * i * step:.0f}%")
            for i in range(int(top / step + 1e-9) + 1)]


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``raw``."""
    if raw <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)
