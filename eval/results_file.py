"""A run directory's files: results appended one whole line at a time, read back
whole-lines-only, and rewritten atomically.

A crash mid-append leaves at most a torn last line, which a reader skips and a
writer cuts off before appending (``repair=True``); nothing else is ever rewritten
in place (:func:`rewrite` writes a temporary file and renames it over the old).

Example:
    >>> append_line("runs/sc4/results.jsonl", {"id": "arith-test-0", "passed": True})
    >>> read_results("runs/sc4/results.jsonl")[-1]["passed"]
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from refinery.engine.errors import InvalidRequestError, StorageError
from refinery.engine.trace import append_whole_line

__all__ = ["append_line", "compact_traces", "read_results", "rewrite", "snapshot",
           "write_json_atomic"]


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


def _complete_part(path: Path, *, repair: bool) -> bytes:
    data = snapshot(path)
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        data = data[:cut]
        if repair:  # cut the torn tail so the next append starts on a fresh line
            os.truncate(path, cut)
    return data


def read_results(path: str | os.PathLike[str], *, repair: bool = False) -> list[dict[str, Any]]:
    """Result rows of a ``results.jsonl``; a torn last line is skipped (and with
    ``repair=True`` truncated off the file). A missing file is an empty run.

    Raises:
        InvalidRequestError: a line other than the last is not valid JSON (edited by hand?).
    """
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    for i, line in enumerate(_complete_part(p, repair=repair).splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"{p}:{i}: corrupt result line ({exc.msg})") from exc
    return rows


def rewrite(path: Path, lines: Sequence[bytes]) -> None:
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
    """Keep one trace (the last) per finished problem; drop torn tails and traces of
    problems that will run again (a kill between trace and result leaves those)."""
    if not path.exists():
        return
    raw = snapshot(path)
    lines = raw.splitlines(keepends=True)
    last: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.endswith(b"\n"):
            continue
        try:
            tid = json.loads(line).get("task_id")
        except json.JSONDecodeError:
            continue
        if tid in keep:
            last[tid] = i
    kept = [lines[i] for i in sorted(last.values())]
    if len(kept) != len(lines):
        rewrite(path, kept)


def write_json_atomic(path: Path, obj: Any) -> None:
    rewrite(path, [(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n").encode()])
