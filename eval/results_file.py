"""A run directory's files: results appended one whole line at a time, read back
whole-lines-only, and rewritten atomically.

A crash mid-append leaves at most a torn last line, which a reader skips and a
writer cuts off before appending (``repair=True``); nothing else is ever rewritten
in place (:func:`rewrite` writes a temporary file and renames it over the old).

Reading never waits and never trusts a line: a FIFO or a device in place of a
file reads as empty (opened non-blocking, regular files only), and a line that is
not a result (not JSON, not UTF-8, not an object, a field of the wrong type) is a
:class:`BadLine` of :func:`parse_results`; :func:`read_results`, for the runner,
refuses the file at the first one.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "results.jsonl"
    >>> append_line(path, {"id": "arith-test-0", "passed": True})
    >>> read_results(path)[-1]["passed"]
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from refinery.engine.errors import InvalidRequestError, StorageError
from refinery.engine.trace import append_whole_line

__all__ = ["BadLine", "ParsedResults", "ResultRow", "append_line", "compact_traces",
           "complete_lines", "parse_results", "read_results", "rewrite", "snapshot",
           "write_json_atomic"]


class RowUsage(BaseModel):
    """A result line's ``usage``: token and call counts of the problem."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int | None = None
    calls: int = 0


class ResultRow(BaseModel):
    """The fields of a result line that its readers (reports, the web page) use, with
    their types; a line whose fields do not fit is not a result. Other fields pass."""

    model_config = ConfigDict(extra="allow")

    id: str | int | None = None
    index: int | None = None
    passed: bool = False
    level: int | None = None
    prompt: str | None = None
    text: str | None = None
    gold: str | int | float | None = None
    prediction: str | int | float | None = None
    strict_match: bool | None = None
    flexible_match: bool | None = None
    usage: RowUsage | None = None
    seconds: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    session: str | None = None
    session_start: float | None = None
    time: float | None = None


@dataclass(frozen=True)
class BadLine:
    """A line of a results file that is not a result, and why."""

    number: int
    reason: str


@dataclass(frozen=True)
class ParsedResults:
    """The result rows of a file's complete lines, and the lines that were not results."""

    rows: list[dict[str, Any]]
    bad: list[BadLine]


def append_line(path: str | os.PathLike[str], row: Mapping[str, Any]) -> None:
    """Append one JSON line whole: a single ``os.write`` with ``O_APPEND``, then ``fsync``.

    A crash leaves either the complete line or nothing of it except, at worst, a
    torn tail that :func:`read_results` cuts off.

    Raises:
        StorageError: the line could not be written (disk full...); nothing of it is left.
    """
    line = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode()
    append_whole_line(path, line, what="result")


def snapshot(path: Path) -> bytes:
    """The bytes a file had when opened; anything but a regular file (``/dev/full``, a
    FIFO) reads as empty.

    Opened non-blocking, since opening a FIFO for reading waits for a writer, and read
    up to the size at open, since reading a device to its "end" may never finish.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        return f.read(st.st_size) if stat.S_ISREG(st.st_mode) else b""


def complete_lines(data: bytes) -> bytes:
    """``data`` up to its last newline: a torn last line (a writer killed mid-write) cut."""
    return data if not data or data.endswith(b"\n") else data[:data.rfind(b"\n") + 1]


def _complete_part(path: Path, *, repair: bool) -> bytes:
    data = snapshot(path)
    whole = complete_lines(data)
    if repair and len(whole) != len(data):  # so the next append starts on a fresh line
        os.truncate(path, len(whole))
    return whole


def parse_results(data: bytes) -> ParsedResults:
    """The result rows of ``data`` (whole lines of a ``results.jsonl``), each a JSON
    object whose fields fit :class:`ResultRow`; every other non-blank line is a
    :class:`BadLine` (numbered from 1)."""
    rows: list[dict[str, Any]] = []
    bad: list[BadLine] = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        row, reason = _parse_row(line)
        if row is None:
            bad.append(BadLine(number, reason))
        else:
            rows.append(row)
    return ParsedResults(rows, bad)


def _parse_row(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """One line as a result row, or None and why it is not one."""
    try:
        row = json.loads(line)  # bytes: invalid UTF-8 is a ValueError too
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as exc:
        return None, f"not JSON: {getattr(exc, 'msg', exc)}"
    except RecursionError:
        return None, "JSON nested too deeply"
    if not isinstance(row, dict):
        return None, f"a JSON {type(row).__name__}, not an object"
    try:
        ResultRow.model_validate(row)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return None, f"{where}: {err['msg']}"
    return row, ""


def read_results(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """Result rows of a ``results.jsonl``; a torn last line is skipped (and with
    ``repair=True`` truncated off the file). A missing file is an empty run.

    Raises:
        InvalidRequestError: a line other than the last is not a result (edited by hand?).
    """
    p = Path(path)
    if not p.exists():
        return []
    parsed = parse_results(_complete_part(p, repair=repair))
    if parsed.bad:
        first = parsed.bad[0]
        raise InvalidRequestError(f"{p}:{first.number}: corrupt result line ({first.reason})")
    return parsed.rows


def rewrite(path: Path, lines: Sequence[bytes]) -> None:
    """Replace ``path`` by ``lines`` atomically: a temporary file, fsynced, renamed over.

    Raises:
        StorageError: the temporary file could not be written; ``path`` is unchanged.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        # The original file is untouched (os.replace is the only step that changes it).
        raise StorageError(f"could not rewrite {path}: {exc.strerror or exc}. The file is "
                           "unchanged; free space (or fix the path) and rerun.") from exc


def compact_traces(path: Path, keep: set[str]) -> None:
    """Keep one trace (the last) per finished problem; drop torn tails, lines that are
    not traces, and traces of problems that will run again (a kill between trace and
    result leaves those)."""
    if not path.exists():
        return
    lines = snapshot(path).splitlines(keepends=True)
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.endswith(b"\n"):
            continue
        tid = _trace_task_id(line)
        if tid in keep:
            last[tid] = i
    kept = [lines[i] for i in sorted(last.values())]
    if len(kept) != len(lines):
        rewrite(path, kept)


def _trace_task_id(line: bytes) -> str | None:
    """A trace line's ``task_id``, or None when the line is not an object with a string id."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None
    tid = obj.get("task_id") if isinstance(obj, dict) else None
    return tid if isinstance(tid, str) else None


def write_json_atomic(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON in ``path``, written by :func:`rewrite`."""
    rewrite(path, [(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n").encode()])
