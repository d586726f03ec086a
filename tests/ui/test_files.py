"""Run files are read beneath the runs root only, whatever is swapped meanwhile: a
directory exchanged with a symlink to an outside folder (``renameat2``
``RENAME_EXCHANGE``, atomic) while pages of it are requested serves nothing of the
outside folder, neither the trace nor the bytes of a file that is no trace."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from refinery.ui import UISettings, create_ui_app
from refinery.ui.files import RunFileError, read_file, stamp

RENAME_EXCHANGE = 2
REQUESTS = 1000


def exchange(a: Path, b: Path) -> None:
    """Swap the names ``a`` and ``b`` in one step (Linux ``renameat2``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    if libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def write_run(path: Path, text: str, trace_line: str | None = None) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"dataset": "toy", "strategy": "cot"}))
    (path / "results.jsonl").write_text(json.dumps({"id": "RACE", "passed": True,
                                                    "prediction": text}) + "\n")
    trace = {"task_id": "RACE", "strategy": "cot", "model": "m", "events": [],
             "error": text}
    (path / "traces.jsonl").write_text((trace_line or json.dumps(trace)) + "\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """``runs/race``, a run, beside ``runs/race-link``, a symlink to an outside run."""
    runs = tmp_path / "runs"
    write_run(runs / "race", "INSIDE-VISIBLE")  # as long as the outside text
    write_run(tmp_path / "outside", "OUTSIDE-SECRET")
    (runs / "race-link").symlink_to(tmp_path / "outside", target_is_directory=True)
    return runs


SWAPPER = """
import sys, time
from pathlib import Path
from tests.ui.test_files import exchange
a, b = Path(sys.argv[1]), Path(sys.argv[2])
end = time.monotonic() + float(sys.argv[3])
print("swapping", flush=True)
while time.monotonic() < end:
    exchange(a, b)
"""


def raced(root: Path, urls: list[str]) -> list[str]:
    """The bodies of ``REQUESTS`` requests (``urls`` in turn) while another process
    (on the other core: a thread would share the GIL) swaps ``race`` and ``race-link``
    as fast as it can, for at most 120 s."""
    client = TestClient(create_ui_app(UISettings(runs=root, draw_in_process=False)),
                        raise_server_exceptions=False)
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(root / "race"),
                                str(root / "race-link"), "120"], stdout=subprocess.PIPE)
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"swapping\n"
        return [client.get(urls[i % len(urls)]).text for i in range(REQUESTS)]
    finally:
        swapper.kill()
        swapper.wait()


def test_a_directory_swapped_with_an_outside_link_serves_nothing_outside(root) -> None:
    bodies = raced(root, ["/ui/trace?run=race&task=RACE", "/ui/run?path=race", "/ui/runs"])
    assert sum("OUTSIDE-SECRET" in b for b in bodies) == 0
    assert sum("INSIDE" in b for b in bodies) > 0  # the race did reach the files


def test_an_outside_file_that_is_no_trace_never_shows_its_bytes(root, tmp_path) -> None:
    outside = tmp_path / "outside" / "traces.jsonl"
    outside.write_text('{"task_id": "RACE", "events": "PASSWORD=hunter2"}\n')
    bodies = raced(root, ["/ui/trace?run=race&task=RACE"])
    assert sum("hunter2" in b for b in bodies) == 0
    assert sum("INSIDE" in b for b in bodies) > 0


def test_no_component_below_the_root_is_followed_if_it_is_a_link(root, tmp_path) -> None:
    (root / "deep").mkdir()
    (root / "deep" / "run").symlink_to(tmp_path / "outside", target_is_directory=True)
    for path in (root / "race-link" / "config.json", root / "deep" / "run" / "config.json"):
        with pytest.raises(RunFileError, match="symbolic link"):
            read_file(root, path, limit=1 << 20)
        with pytest.raises(RunFileError, match="symbolic link"):
            stamp(root, path)
    with pytest.raises(RunFileError, match="outside the runs directory"):
        read_file(root, root / "race" / ".." / ".." / "outside" / "config.json", 1 << 20)
    assert read_file(root, root / "race" / "config.json", 1 << 20).startswith(b"{")
    assert stamp(root, root / "race" / "nope.json") is None
    assert stamp(root, root / "race" / ("x" * 300)) is None  # too long a name names nothing


def test_a_hard_link_is_read_as_the_file_it_is(root, tmp_path) -> None:
    """The documented limit: a hard link is the file itself, wherever its other name is."""
    os.link(tmp_path / "outside" / "results.jsonl", root / "race" / "linked.jsonl")
    assert b"OUTSIDE-SECRET" in read_file(root, root / "race" / "linked.jsonl", 1 << 20)
