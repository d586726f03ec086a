"""Reading the runs directory's files for the page: regular files inside the root only.

Every read resolves the path and refuses one outside the root (a symlink out of
it, say), opens it with ``O_NOFOLLOW | O_NONBLOCK`` (opening a FIFO for reading
would wait for a writer, and the server with it) and reads only a regular file
(``fstat``: no FIFO, device or directory), never more than a limit. A file that
cannot be read so is a :class:`RunFileError` saying why; a missing file is
``None``. A :class:`Stamp` (inode, size, mtime) names a file's content, so the
readers above cache what they parsed until the file changes.

Example:
    >>> read_file(Path("runs"), Path("runs/cot/config.json"), limit=1 << 20)[:1]
    b'{'
"""

from __future__ import annotations

import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from refinery.engine.errors import InvalidRequestError

T = TypeVar("T")
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
CHUNK = 1 << 20


class RunFileError(InvalidRequestError):
    """A file of a run the page cannot show: outside the runs directory, not a regular
    file, over the size limit, unreadable, or not what that file should hold."""

    status = 422


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a file: a new inode, size or mtime is a change."""

    device: int
    inode: int
    size: int
    mtime_ns: int


def inside(root: Path, path: Path) -> Path:
    """``path`` resolved (symlinks followed), if it stays inside ``root``.

    Raises:
        RunFileError: it resolves outside ``root`` (or cannot be resolved).
    """
    try:
        real = path.resolve()
        base = root.resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL...
        raise RunFileError(f"{path.name}: cannot resolve ({exc})") from None
    if not real.is_relative_to(base):
        raise RunFileError(f"{path.name} leads outside the runs directory")
    return real


def stamp(root: Path, path: Path) -> Stamp | None:
    """The file's :class:`Stamp`, or None when it does not exist.

    Raises:
        RunFileError: outside the root, or not a regular file.
    """
    real = inside(root, path)
    try:
        st = os.stat(real, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFileError(f"{path.name}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path.name} is not a regular file")
    return Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_regular(root: Path, path: Path) -> tuple[int, os.stat_result] | None:
    """An open descriptor of a regular file inside ``root`` and its ``fstat``, or None
    when it does not exist. The caller closes it.

    Raises:
        RunFileError: outside the root, a symlink, not a regular file, or unreadable.
    """
    real = inside(root, path)
    try:
        fd = os.open(real, OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFileError(f"{path.name}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RunFileError(f"{path.name} is not a regular file")
    return fd, st


def read_file(root: Path, path: Path, limit: int) -> bytes | None:
    """The whole of a regular file inside ``root`` (None: it does not exist).

    Raises:
        RunFileError: as :func:`open_regular`, or the file is over ``limit`` bytes.
    """
    opened = open_regular(root, path)
    if opened is None:
        return None
    fd, st = opened
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise RunFileError(f"{path.name} is {st.st_size:,} bytes, over the page's limit "
                               f"of {limit:,}")
        return f.read(st.st_size)


def complete_lines(root: Path, path: Path, max_line: int) -> Iterator[tuple[int, int, bytes]]:
    """``(number, offset, line)`` of each complete line of a file inside ``root`` (a torn
    last line is left out); a line over ``max_line`` bytes comes as ``b""`` (not read
    whole). Nothing when the file does not exist.

    Raises:
        RunFileError: as :func:`open_regular`.
    """
    opened = open_regular(root, path)
    if opened is None:
        return
    fd, st = opened
    with os.fdopen(fd, "rb") as f:
        offset, number = 0, 0
        while offset < st.st_size:
            line, size = _line(f, max_line)
            if not size or offset + size > st.st_size:
                return  # a torn or growing tail: not a whole line yet
            number += 1
            yield number, offset, line
            offset += size


def _line(f, max_line: int) -> tuple[bytes, int]:
    """The next line (with its newline) and its size; an overlong one as ``b""`` and its
    size, skipped chunk by chunk. Size 0: no complete line left."""
    line = f.readline(max_line + 1)
    if line.endswith(b"\n"):
        return line, len(line)
    if len(line) <= max_line:
        return b"", 0  # end of file without a newline: torn
    size = len(line)
    while True:
        chunk = f.readline(CHUNK)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            return b"", size
        if not chunk:
            return b"", 0


def read_at(root: Path, path: Path, offset: int, size: int) -> bytes:
    """``size`` bytes of a file inside ``root`` from ``offset``.

    Raises:
        RunFileError: as :func:`open_regular`, or the file is gone.
    """
    opened = open_regular(root, path)
    if opened is None:
        raise RunFileError(f"{path.name} is gone")
    fd, _ = opened
    with os.fdopen(fd, "rb") as f:
        f.seek(offset)
        return f.read(size)


class VersionCache(Generic[T]):
    """One value per key, kept while the key's version (its files' stamps) is unchanged;
    at most ``size`` keys, the least recently used dropped first. A new version
    replaces the old one, so a run being written keeps one entry, not one per line."""

    def __init__(self, size: int):
        self.size = size
        self.hits = self.misses = 0
        self._items: OrderedDict[Hashable, tuple[Hashable, T]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: Hashable, compute: Callable[[], T]) -> T:
        """The value of ``key`` at ``version``, computed (outside the lock) if not held."""
        with self._lock:
            held = self._items.get(key)
            if held is not None and held[0] == version:
                self._items.move_to_end(key)
                self.hits += 1
                return held[1]
            self.misses += 1
        value = compute()
        with self._lock:
            self._items[key] = (version, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value
