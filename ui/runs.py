"""Eval run directories under one root, read for the page: runs, problems, traces.

A run directory is what ``refinery eval run`` writes (``config.json``,
``results.jsonl``, ``traces.jsonl``). Runs are found up to :data:`MAX_DEPTH`
levels below the root and named by their path relative to it; a name that
leads outside the root, or to no run, is a 404, so a request can only read run
files under the directory the server was started with.

Example:
    >>> [r.name for r in list_runs(Path("runs"))]
    ['cot-arith', 'gsm8k/ssr']
    >>> find_trace(resolve_run(Path("runs"), "cot-arith"), "arith-test-0").task_id
    'arith-test-0'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from refinery.engine.context import Budget
from refinery.engine.errors import InvalidRequestError, NotFoundError
from refinery.engine.trace import Trace
from refinery.eval.report import RunReport, load_run
from refinery.eval.runner import CONFIG, RESULTS, TRACES, read_results

MAX_DEPTH = 3


class RunRow(BaseModel):
    """One run of the list: its name under the root and its numbers (or why it has none)."""

    name: str
    report: RunReport | None = None
    error: str | None = None


class Problem(BaseModel):
    """One problem of a run, as its result line has it."""

    index: int
    id: str
    passed: bool
    prediction: str | None = None
    gold: str | None = None
    prompt: str = ""
    text: str = ""
    tokens: int = 0
    calls: int = 0
    seconds: float = 0.0
    finish_reason: str | None = None
    error: str | None = None


def list_runs(root: Path) -> list[RunRow]:
    """Every run directory under ``root`` (itself included), sorted by name."""
    return [run_row(path, path.relative_to(root).as_posix() if path != root else ".")
            for path in sorted(_run_dirs(root, MAX_DEPTH))]


def run_row(path: Path, name: str) -> RunRow:
    """A run's numbers, or why it has none (a corrupt results file, say)."""
    try:
        return RunRow(name=name, report=load_run(path))
    except (InvalidRequestError, OSError, ValueError) as exc:
        return RunRow(name=name, error=str(exc))


def _run_dirs(path: Path, depth: int) -> list[Path]:
    if (path / CONFIG).is_file():
        return [path]
    if depth == 0 or not path.is_dir():
        return []
    found = []
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink() and not child.name.startswith("."):
            found += _run_dirs(child, depth - 1)
    return found


def resolve_run(root: Path, name: str) -> Path:
    """The run directory ``name`` (relative to ``root``).

    Raises:
        NotFoundError: ``name`` is not a run under ``root``.
    """
    base = root.resolve()
    path = (base / name).resolve()
    if not path.is_relative_to(base) or not (path / CONFIG).is_file():
        raise NotFoundError(f"no run named {name!r} here")
    return path


def problems(run: Path) -> list[Problem]:
    """The run's problems in dataset order (the first result line of each, as reports do)."""
    out: dict[str, Problem] = {}
    for r in read_results(run / RESULTS):
        if r.get("id") is None or str(r["id"]) in out:
            continue
        usage = r.get("usage") or {}
        out[str(r["id"])] = Problem(
            index=r.get("index") or 0, id=str(r["id"]), passed=bool(r.get("passed")),
            prediction=_text(r.get("prediction")), gold=_text(r.get("gold")),
            prompt=str(r.get("prompt") or ""), text=str(r.get("text") or ""),
            tokens=usage.get("total_tokens") or 0, calls=usage.get("calls") or 0,
            seconds=r.get("seconds") or 0.0, finish_reason=r.get("finish_reason"),
            error=r.get("error"))
    return sorted(out.values(), key=lambda p: p.index)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def find_trace(run: Path, task_id: str) -> Trace:
    """The trace of ``task_id`` in the run (its last one, if a resumed run has several).

    Raises:
        NotFoundError: the run has no trace of that task.
    """
    found = None
    path = run / TRACES
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # a torn last line: a writer killed mid-write
                if _task_id(line) == task_id:
                    found = line
    if found is None:
        raise NotFoundError(f"no trace of task {task_id!r} in this run")
    return Trace.model_validate_json(found)


_DECODER = json.JSONDecoder()
_HEAD = '{"task_id":'


def _task_id(line: str) -> Any:
    """A trace line's task id, read without parsing the (maybe megabytes of) events."""
    if line.startswith(_HEAD):
        try:
            return _DECODER.raw_decode(line, len(_HEAD))[0]
        except json.JSONDecodeError:
            return None
    return json.loads(line).get("task_id")


def run_limits(run: Path) -> tuple[Budget, int | None]:
    """The per-problem budget the run had, and its strategy's worst-case calls."""
    cfg = json.loads((run / CONFIG).read_text(encoding="utf-8"))
    budget = Budget.model_validate(cfg.get("budget") or {})
    return budget, (cfg.get("strategy") or {}).get("worst_case_calls")
