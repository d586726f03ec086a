"""Reading the runs directory's files for the page: regular files beneath the root only.

Every file is opened relative to the root, one path component at a time: the root
is opened as a directory, each directory below it with ``O_DIRECTORY |
O_NOFOLLOW`` relative to the one before (``dir_fd``), the file itself with
``O_NOFOLLOW | O_NONBLOCK`` (opening a FIFO for reading would wait for a writer,
and the server with it), and only a regular file is read (``fstat`` on the
descriptor: no FIFO, device or directory), never more than a limit. Nothing is
opened by path twice, so swapping a directory for a symlink between a check and
a read leads nowhere: no symbolic link is followed below the root, and a name
with ``..`` is refused before anything is opened. A hard link to a file outside
is read (a hard link is that file; only who can write the runs directory can
make one). A file that cannot be read so is a :class:`RunFileError` saying why;
a missing file is ``None``. A :class:`Stamp` (inode, size, mtime) names a file's
content, so the readers above cache what they parsed until the file changes.

Example:
    >>> read_file(Path("runs"), Path("runs/cot/config.json"), limit=1 << 20)[:1]  # doctest: +SKIP
    b'{'
"""

from __future__ import annotations

import errno
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
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | CLOEXEC
CHUNK = 1 << 20
MISSING = (errno.ENOENT, errno.ENAMETOOLONG)  # no such file: what a name too long is too


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


def parts_beneath(root: Path, path: Path) -> tuple[str, ...]:
    """The components of ``path`` below ``root``, read from the names alone.

    Raises:
        RunFileError: ``path`` is not below ``root`` as written, or has a ``..``.
    """
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise RunFileError(f"{path.name} leads outside the runs directory") from None
    if not parts or ".." in parts:
        raise RunFileError(f"{path.name} leads outside the runs directory")
    return parts


def beneath(root: Path, path: Path, last: Callable[[int, str], T]) -> T | None:
    """``last(dir_fd, name)`` on the last component of ``path``, the directories before
    it opened one at a time from ``root`` without following a symlink (None: a
    component is missing).

    Raises:
        RunFileError: a component is a symlink or not a directory, or cannot be opened.
    """
    parts = parts_beneath(root, path)
    try:
        fd = os.open(root, DIR_FLAGS & ~os.O_NOFOLLOW)  # the root as the operator named it
    except OSError as exc:
        raise _refused(path, exc) from None
    try:
        for name in parts[:-1]:
            inner = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        return last(fd, parts[-1])
    except OSError as exc:
        if exc.errno in MISSING:
            return None
        raise _refused(path, exc) from None
    finally:
        os.close(fd)


def _refused(path: Path, exc: OSError) -> RunFileError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return _linked(path)
    return RunFileError(f"{path.name}: {exc.strerror or exc}")


def _linked(path: Path) -> RunFileError:
    return RunFileError(f"{path.name} is a symbolic link, or is reached through one (or "
                        "through a file where a directory should be): the page follows no "
                        "links, since a link leads outside the runs directory as easily as "
                        "within it")


def stamp(root: Path, path: Path) -> Stamp | None:
    """The file's :class:`Stamp`, or None when it does not exist.

    Raises:
        RunFileError: reached through a symlink, or not a regular file.
    """
    st = beneath(root, path, lambda fd, name: os.stat(name, dir_fd=fd,
                                                        follow_symlinks=False))
    if st is None:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise _linked(path)
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path.name} is not a regular file")
    return Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_regular(root: Path, path: Path) -> tuple[int, os.stat_result] | None:
    """An open descriptor of a regular file beneath ``root`` and its ``fstat``, or None
    when it does not exist. The caller closes it.

    Raises:
        RunFileError: a symlink on the way or at the end, not a regular file, unreadable.
    """
    fd = beneath(root, path, lambda dir_fd, name: os.open(name, OPEN_FLAGS, dir_fd=dir_fd))
    if fd is None:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RunFileError(f"{path.name} is not a regular file")
    return fd, st


def stamp_at(dir_fd: int, name: str) -> Stamp | None:
    """The :class:`Stamp` of the file ``name`` in the open directory ``dir_fd`` (None:
    there is none).

    Raises:
        RunFileError: it is a symlink, or not a regular file.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in MISSING:
            return None
        raise _refused(Path(name), exc) from None
    if stat.S_ISLNK(st.st_mode):
        raise _linked(Path(name))
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{name} is not a regular file")
    return Stamp(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def walk_directories(root: Path, depth: int,
                     visit: Callable[[int, tuple[str, ...]], bool]) -> None:
    """``visit(dir_fd, parts)`` for ``root`` (``parts == ()``) and each directory below
    it, up to ``depth`` levels down, each opened relative to the one above without
    following a link, hidden names left out, in name order. Where ``visit`` returns
    True, the walk does not go below. An unreadable directory is left out."""
    try:
        fd = os.open(root, DIR_FLAGS & ~os.O_NOFOLLOW)  # the root as the operator named it
    except OSError:
        return
    _walk(fd, (), depth, visit)


def _walk(fd: int, parts: tuple[str, ...], depth: int,
          visit: Callable[[int, tuple[str, ...]], bool]) -> None:
    """:func:`walk_directories` from the open ``fd`` (closed here); recursion at most
    ``depth`` deep, one descriptor open per level."""
    try:
        if visit(fd, parts) or depth == 0:
            return
        with os.scandir(fd) as entries:
            names = sorted(e.name for e in entries
                           if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))
        for name in names:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:  # swapped for a link, gone, unreadable: left out
                continue
            _walk(child, (*parts, name), depth - 1, visit)
    except OSError:
        return
    finally:
        os.close(fd)


def read_file(root: Path, path: Path, limit: int) -> bytes | None:
    """The whole of a regular file beneath ``root`` (None: it does not exist).

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
    """``(number, offset, line)`` of each complete line of a file beneath ``root`` (a torn
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
    """``size`` bytes of a file beneath ``root`` from ``offset``.

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
