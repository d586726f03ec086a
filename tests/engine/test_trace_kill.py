"""TraceWriter under SIGKILL and on a full disk.

A subprocess appends traces in a tight loop and prints each id only after
``write_sync`` returned (the acknowledgement); it is SIGKILLed at random points
(seeded) at least 20 times, and restarted on the same file each time. After
every kill the raw bytes are checked: each newline-terminated line is a whole
trace, an unterminated tail (a kill inside the write) is skipped by
``read_traces`` and cut off by the next writer, no acknowledged id is missing,
no id appears twice. Some kills are followed by an injected torn tail (the
bytes a kernel leaves when a write dies part-way), so the repair path runs even
when no kill happens to land inside a write.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from refinery.engine.errors import RefineryError, StorageError
from refinery.engine.trace import Trace, TraceWriter, read_traces, repair_tail
from refinery.engine.types import Attempt, Usage
from tests.conftest import repeat

ROOT = Path(__file__).resolve().parents[2]
KILLS = repeat(8, 24)
SEED = 20240611

# The writer: sizes from 100 B to 400 KB, so some writes span many pages and a kill
# has a chance to land inside one. Prints "ready" once the writer (and its repair) is up.
WORKER = r"""
import random, sys
from refinery.engine.trace import Trace, TraceEvent, TraceWriter
from refinery.engine.types import Attempt, Usage

path, prefix, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
writer = TraceWriter(path)
print("ready", writer.repaired, flush=True)
i = 0
while True:
    size = rng.choice([100, 2_000, 50_000, 400_000])
    t = Trace(task_id=f"{prefix}-{i}", strategy="cot", model="none",
              attempt=Attempt(text="x" * size, answer=str(i)), usage=Usage(calls=1))
    t.add(TraceEvent(kind="step", step="draft", strategy="cot", text="y" * (size // 2)))
    writer.write_sync(t)
    print(t.task_id, flush=True)
    i += 1
"""


class Worker:
    """The writer subprocess, with a thread collecting its acknowledgements."""

    def __init__(self, path: Path, prefix: str, seed: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(path), prefix,
                                      str(seed)], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            self.ready.set()

    def kill_after(self, delay: float) -> None:
        # Waiting for "ready" (not a timed assert: only a generous upper bound on a hang).
        if not self.ready.wait(120):
            self.proc.kill()
            raise AssertionError(f"writer never started: {self.proc.stderr.read()[-2000:]}")
        time.sleep(delay)
        assert self.proc.poll() is None, self.proc.stderr.read()[-2000:]
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join()  # EOF once the pipe's writer is dead: every ack is read
        self.proc.stderr.close()

    @property
    def acked(self) -> list[str]:
        return [x for x in self.lines if not x.startswith("ready")]


def check_file(path: Path) -> tuple[list[str], bytes]:
    """Ids of the whole lines (each must parse) and the unterminated tail, if any."""
    raw = path.read_bytes() if path.exists() else b""
    *whole, tail = raw.split(b"\n")
    ids = []
    for n, line in enumerate(whole, 1):
        ids.append(Trace.model_validate_json(line).task_id)  # raises on a torn line
        assert line.startswith(b"{") and line.endswith(b"}"), f"line {n} is not whole"
    return ids, tail


def test_sigkill_loop_never_tears_a_line_or_loses_an_acknowledged_trace(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    rng = random.Random(SEED)
    acked: set[str] = set()
    seen: set[str] = set()
    natural_torn = injected = lines_checked = 0
    torn_before = False  # whether the file this writer opens ends in a torn tail
    for k in range(KILLS):
        w = Worker(path, f"k{k}", SEED + k)
        w.kill_after(rng.uniform(0.0, 0.4))
        assert w.proc.returncode == -signal.SIGKILL
        ready = [x for x in w.lines if x.startswith("ready")]
        assert (int(ready[0].split()[1]) > 0) == torn_before, f"kill {k}: repair mismatch"
        acked |= set(w.acked)

        ids, tail = check_file(path)
        lines_checked += len(ids)
        assert len(ids) == len(set(ids)), "a trace was written twice"
        assert acked <= set(ids), f"acknowledged but missing: {sorted(acked - set(ids))[:5]}"
        # At most the trace being written when the kill landed is in the file unacknowledged.
        assert len(set(ids) - seen - set(w.acked)) <= 1
        assert seen <= set(ids), "a trace of an earlier writer vanished"
        seen = set(ids)
        assert [t.task_id for t in read_traces(path)] == ids
        torn_before = bool(tail) or (k % 4 == 1 and bool(ids))
        if tail:
            natural_torn += 1
        elif k % 4 == 1 and ids:
            # What a write killed part-way leaves: the first bytes of a line, no newline.
            with open(path, "ab") as f:
                f.write(path.read_bytes().split(b"\n")[-2][:1000])
            injected += 1
            assert [t.task_id for t in read_traces(path)] == ids

    # A last writer on the file: it repairs whatever tail the last kill left, and appends.
    w = Worker(path, "final", SEED)
    w.kill_after(0.2)
    ready = [x for x in w.lines if x.startswith("ready")]
    assert (int(ready[0].split()[1]) > 0) == torn_before, "final writer: repair mismatch"
    acked |= set(w.acked)
    ids, tail = check_file(path)
    assert len(ids) == len(set(ids)) and acked <= set(ids)
    print(f"\nkills={KILLS + 1} whole lines={len(ids)} acked={len(acked)} "
          f"torn tails (each repaired by the next writer): natural={natural_torn} "
          f"injected={injected} "
          f"lines checked over all kills={lines_checked}")
    # Each writer's own repair report was checked against the tail it found (above).
    assert natural_torn + injected > 0, "the repair path never ran"
    assert len(acked) >= KILLS  # the kills landed while writing, not before the first trace


def sample(task_id: str = "t") -> Trace:
    return Trace(task_id=task_id, attempt=Attempt(text="4", answer="4"), usage=Usage(calls=1))


def test_a_full_disk_raises_a_clear_storage_error(tmp_path) -> None:
    path = tmp_path / "traces.jsonl"
    path.symlink_to("/dev/full")  # every write there fails with ENOSPC
    w = TraceWriter(path)
    with pytest.raises(StorageError) as info:
        w.write_sync(sample())
    exc = info.value
    assert isinstance(exc, OSError) and isinstance(exc, RefineryError)
    assert exc.errno == errno.ENOSPC and exc.code == "ENOSPC"
    assert str(path) in str(exc) and "No space left on device" in str(exc)
    assert exc.to_openai()["error"]["type"] == "storage_error"


def test_a_short_write_leaves_no_partial_line(tmp_path, monkeypatch) -> None:
    path = tmp_path / "traces.jsonl"
    w = TraceWriter(path)
    w.write_sync(sample("a"))
    before = path.read_bytes()
    real_write = os.write

    def half(fd: int, data: bytes) -> int:  # the device fills up half-way through the line
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(StorageError, match="short write"):
        w.write_sync(sample("b"))
    monkeypatch.undo()
    assert path.read_bytes() == before
    w.write_sync(sample("c"))
    assert [t.task_id for t in read_traces(path)] == ["a", "c"]


def test_repair_cuts_a_tail_longer_than_the_scan_block(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"z" * 200_000)
    assert repair_tail(path) == 200_000 and path.read_bytes() == b'{"a": 1}\n'
    path.write_bytes(b"z" * 70_000)  # no newline at all: the whole file is one torn line
    assert repair_tail(path) == 70_000 and path.read_bytes() == b""
    assert repair_tail(tmp_path / "missing.jsonl") == 0
