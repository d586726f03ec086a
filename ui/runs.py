"""Eval run directories under one root, read for the page: runs, problems, traces.

A run directory is what ``refinery eval run`` writes (``config.json``,
``results.jsonl``, ``traces.jsonl``). Runs are found up to :data:`MAX_DEPTH`
levels below the root and named by their path relative to it; a name that
leads outside the root, or to no run, is a 404, so a request can only read run
files under the directory the server was started with.

Every file is read through :mod:`refinery.ui.files` (regular files inside the
root, never a wait) and never trusted: a line that is not a result, or a
config field of the wrong type, becomes a note on the page ("run X: results.jsonl
line 7 is not a result (...)") and the rest is shown. What a run's files hold is
parsed once per version of them (cached by inode, size and mtime); a traces file
is indexed once (task id to line), however its JSON was formatted.

Example:
    >>> [r.name for r in list_runs(Path("runs"))]  # doctest: +SKIP
    ['cot-arith', 'gsm8k/ssr']
    >>> run = resolve_run(Path("runs"), "cot-arith")  # doctest: +SKIP
    >>> find_trace(Path("runs"), run, "arith-test-0").task_id  # doctest: +SKIP
    'arith-test-0'
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from refinery.engine.context import Budget
from refinery.engine.errors import InvalidRequestError, NotFoundError
from refinery.engine.trace import Trace
from refinery.eval.report import RunConfig, RunReport, summarize_run
from refinery.eval.results_file import ResultRow, complete_lines, parse_results
from refinery.eval.runner import CONFIG, RESULTS, TRACES
from refinery.ui.files import (
    RunFileError,
    Stamp,
    VersionCache,
    read_at,
    read_file,
    stamp,
    stamp_at,
    walk_directories,
)
from refinery.ui.files import complete_lines as file_lines

MAX_DEPTH = 3
MAX_CONFIG_BYTES = 8 << 20
MAX_RESULTS_BYTES = 64 << 20
MAX_TRACE_BYTES = 8 << 20  # a trace line of a run, or a posted trace: the same limit
NAME_MAX = 255  # bytes of one file name (Linux): a longer one names nothing
MAX_NOTES = 20  # per file; the rest are counted
ID_PREFIX_BYTES = 4096  # a trace line's task id is read from this much of its head


class RunRow(BaseModel):
    """One run of the list: its name under the root and its numbers (or why it has none),
    and notes on what of its files was skipped."""

    name: str
    report: RunReport | None = None
    error: str | None = None
    notes: list[str] = Field(default_factory=list)


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


@dataclass(frozen=True)
class RunFiles:
    """What a run's config and results hold: the config (None: unreadable, ``error``
    says why), the result rows, and notes on the lines skipped."""

    config: RunConfig | None
    rows: list[dict[str, Any]]
    notes: list[str]
    error: str | None = None


@dataclass(frozen=True)
class TraceIndex:
    """Where each task's (last) trace is in a traces file: ``(offset, size, line)``."""

    at: dict[str, tuple[int, int, int]]
    notes: list[str]


RUN_FILES: VersionCache[RunFiles] = VersionCache(size=16)  # results rows: large
RUN_ROWS: VersionCache[RunRow] = VersionCache(size=100_000)  # the list's rows: small
TRACE_INDEXES: VersionCache[TraceIndex] = VersionCache(size=32)


# --------------------------------------------------------------------------------- runs


def list_runs(root: Path) -> list[RunRow]:
    """Every run directory under ``root`` (itself included), sorted by name; a run is
    read only when its files changed since the last list (its stamps say)."""
    return [RUN_ROWS.get((root, path, name), stamps, lambda p=path, n=name: run_row(root, p, n))
            for name, path, stamps in sorted(found_runs(root))]


def run_row(root: Path, path: Path, name: str) -> RunRow:
    """A run's numbers, or why it has none (an unreadable config, say), with notes."""

    files = run_files(root, path, name)
    if files.config is None:
        return RunRow(name=name, error=files.error, notes=files.notes)
    report = summarize_run(name, str(path), files.config, files.rows)
    return RunRow(name=name, report=report, notes=files.notes)


def found_runs(root: Path) -> list[tuple[str, Path, tuple[Stamp | None, ...] | None]]:
    """``(name, path, stamps)`` of each run under ``root``: a directory holding a regular
    config file, up to :data:`MAX_DEPTH` levels down, none hidden, none reached through
    a link; ``stamps`` are its config's and results' (None: one is not a regular file)."""
    found = []

    def visit(fd: int, parts: tuple[str, ...]) -> bool:
        try:
            config = stamp_at(fd, CONFIG)
        except RunFileError:  # a FIFO, a link: not a run
            return False
        if config is None:
            return False
        try:
            stamps: tuple[Stamp | None, ...] | None = (config, stamp_at(fd, RESULTS))
        except RunFileError:
            stamps = None  # its row says why, until the file is regular
        found.append(("/".join(parts) or ".", root.joinpath(*parts), stamps))
        return True

    walk_directories(root, MAX_DEPTH, visit)
    return found


def _is_run(root: Path, path: Path) -> bool:
    try:
        return stamp(root, path / CONFIG) is not None
    except RunFileError:  # a FIFO, a link: not a run
        return False


def resolve_run(root: Path, name: str) -> Path:
    """The run directory ``name`` (relative to ``root``), if the list shows it: at most
    :data:`MAX_DEPTH` names, none hidden, ``..``, empty or over 255 bytes.

    Raises:
        NotFoundError: ``name`` is not a run the list of ``root`` shows.
    """
    parts = [] if name == "." else name.split("/")
    if len(parts) > MAX_DEPTH or not all(_listable(p) for p in parts):
        raise NotFoundError(f"no run named {name!r} here")
    path = root.joinpath(*parts)
    if not _is_run(root, path):
        raise NotFoundError(f"no run named {name!r} here")
    return path


def _listable(part: str) -> bool:
    """A directory name the list can show (what ``walk_directories`` goes into)."""
    try:
        size = len(part.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return 0 < size <= NAME_MAX and not part.startswith(".") and "\0" not in part


def run_files(root: Path, run: Path, name: str) -> RunFiles:
    """The run's config and results as :class:`RunFiles`, parsed once per version."""
    try:
        stamps = (stamp(root, run / CONFIG), stamp(root, run / RESULTS))
    except RunFileError as exc:
        return RunFiles(None, [], [], error=f"run {name}: {exc.message}")
    return RUN_FILES.get((root, run, name), stamps, lambda: _run_files(root, run, name))


def _run_files(root: Path, run: Path, name: str) -> RunFiles:
    try:
        config = RunConfig.parse(read_file(root, run / CONFIG, MAX_CONFIG_BYTES) or b"")
    except InvalidRequestError as exc:  # RunFileError included
        return RunFiles(None, [], [], error=f"run {name}: {exc.message}")
    try:
        data = read_file(root, run / RESULTS, MAX_RESULTS_BYTES) or b""
    except RunFileError as exc:
        return RunFiles(config, [], [f"run {name}: {exc.message}"])
    parsed = parse_results(complete_lines(data))
    notes = [f"run {name}: {RESULTS} line {b.number} is not a result ({b.reason})"
             for b in parsed.bad]
    return RunFiles(config, parsed.rows, _capped(notes))


def _capped(notes: list[str]) -> list[str]:
    if len(notes) <= MAX_NOTES:
        return notes
    return [*notes[:MAX_NOTES], f"... and {len(notes) - MAX_NOTES:,} more"]


def problems(root: Path, run: Path, name: str) -> tuple[list[Problem], list[str]]:
    """The run's problems in dataset order (the first result line of each, as reports
    do), and the notes on its files."""
    files = run_files(root, run, name)
    out: dict[str, Problem] = {}
    for raw in files.rows:
        r = ResultRow.model_validate(raw)
        if r.id is None or str(r.id) in out:
            continue
        usage = r.usage
        out[str(r.id)] = Problem(
            index=r.index or 0, id=str(r.id), passed=r.passed,
            prediction=_text(r.prediction), gold=_text(r.gold), prompt=r.prompt or "",
            text=r.text or "", tokens=(usage.total_tokens or 0) if usage else 0,
            calls=usage.calls if usage else 0, seconds=r.seconds or 0.0,
            finish_reason=r.finish_reason, error=r.error)
    notes = files.notes if files.error is None else [files.error, *files.notes]
    return sorted(out.values(), key=lambda p: p.index), notes


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def run_limits(root: Path, run: Path, name: str) -> tuple[Budget, int | None, list[str]]:
    """The per-problem budget the run had, its strategy's worst-case calls, and a note
    if the config's budget could not be read (then no limits are shown)."""
    config = run_files(root, run, name).config
    if config is None:
        return Budget(), None, []
    try:
        budget = Budget.model_validate(config.budget or {})
    except ValidationError as exc:
        return Budget(), config.strategy.worst_case_calls, [
            f"run {name}: {CONFIG} budget is not a budget ({invalid_because(exc)}); "
            "shown without limits"]
    return budget, config.strategy.worst_case_calls, []


# ------------------------------------------------------------------------------- traces


def find_trace(root: Path, run: Path, task_id: str, name: str = "") -> Trace:
    """The trace of ``task_id`` in the run (its last one, if a resumed run has several).

    Raises:
        NotFoundError: the run has no trace of that task.
        RunFileError: the traces file cannot be read, or that line is not a trace.
    """
    path = run / TRACES
    index = trace_index(root, path)
    if task_id not in index.at:
        raise NotFoundError(f"no trace of task {task_id!r} in this run")
    offset, size, number = index.at[task_id]
    line = read_at(root, path, offset, size)
    try:
        return Trace.model_validate_json(line)
    except ValidationError as exc:
        raise RunFileError(f"run {name}: {TRACES} line {number}, the trace of {task_id!r}, "
                           f"is not a refinery trace ({invalid_because(exc)})",
                           param="task") from None


def invalid_because(exc: ValidationError, most: int = 2) -> str:
    """What pydantic found wrong (where, and why), never the input it was given: a
    file's bytes, whatever the file turned out to be, stay out of the page.

    >>> try:
    ...     Budget.model_validate({"max_calls": "PASSWORD=hunter2"})
    ... except ValidationError as exc:
    ...     invalid_because(exc)
    'max_calls: Input should be a valid integer, unable to parse string as an integer'
    """
    errors = exc.errors(include_input=False, include_url=False, include_context=False)
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}"
                     for e in errors[:most])


def trace_index(root: Path, path: Path) -> TraceIndex:
    """The :class:`TraceIndex` of a traces file, built once per version of it."""
    return TRACE_INDEXES.get((root, path), stamp(root, path), lambda: _trace_index(root, path))


def _trace_index(root: Path, path: Path) -> TraceIndex:
    at: dict[str, tuple[int, int, int]] = {}
    notes: list[str] = []
    for number, offset, line in file_lines(root, path, MAX_TRACE_BYTES):
        if not line:
            notes.append(f"{TRACES} line {number} is over {MAX_TRACE_BYTES:,} bytes")
            continue
        task_id, why = line_task_id(line)
        if task_id is None:
            if line.strip():
                notes.append(f"{TRACES} line {number} is not a trace ({why})")
            continue
        at[task_id] = (offset, len(line), number)
    return TraceIndex(at, _capped(notes))


_HEAD = re.compile(rb'\s*\{\s*"task_id"\s*:\s*')
_DECODER = json.JSONDecoder()


def line_task_id(line: bytes) -> tuple[str | None, str]:
    """A trace line's task id (or None and why there is none): read from the line's
    head when ``task_id`` is its first key, as refinery writes it, with or without
    spaces; otherwise from the whole line parsed."""
    head = _HEAD.match(line)
    if head:
        start = head.end()
        text = line[start:start + ID_PREFIX_BYTES].decode("utf-8", "replace")
        try:
            value = _DECODER.raw_decode(text)[0]
        except json.JSONDecodeError:
            value = None
        if isinstance(value, str):
            return value, ""
    return _parsed_task_id(line)


def _parsed_task_id(line: bytes) -> tuple[str | None, str]:
    try:
        obj = json.loads(line)
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as exc:
        return None, f"not JSON: {getattr(exc, 'msg', exc)}"
    except RecursionError:
        return None, "JSON nested too deeply"
    if not isinstance(obj, dict):
        return None, f"a JSON {type(obj).__name__}, not an object"
    task_id = obj.get("task_id")
    if not isinstance(task_id, str):
        return None, "no task_id string"
    return task_id, ""
