"""Soak: the hostile corpus, 100 passes of every program (5 in ``make test``), two at a time.

Every run must end with the same verdict as in ``test_verifiers_hostile`` (a
limit, a refused operation), and afterwards nothing is left: no process of
the sandbox's uids (bwrap itself runs as the run's uid, so a leftover bwrap is
one of those), no child of this process, no daemon carrying the marker, no
sandbox temp dir, no change in a world-writable host directory, no connection
to a listener on the host's 127.0.0.1.

To keep the soak to minutes the limits are lower than in the hostile test: 1 s
of CPU (``cpu_loop`` is killed at the 2 s hard limit instead of 3 s) and a 1 s
wall clock for ``sleep_forever`` (the only program that only the wall clock
ends). The other programs keep a wall clock far above what they need, so a
busy machine cannot turn their verdict into a timeout.

    REFINERY_SOAK_PASSES=100 pytest tests/verifiers/test_sandbox_soak.py -s
"""

from __future__ import annotations

import asyncio
import collections
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

from refinery.verifiers.code import build_program
from refinery.verifiers.sandbox import RunResult, Sandbox, SandboxConfig
from refinery.verifiers.uid_pool import UidPool
from tests.conftest import repeat
from tests.verifiers.test_verifiers_hostile import (
    CHECK,
    EXPECTED,
    HOSTILE,
    SECRET_VAR,
    _processes_with,
    _snapshot,
    hostile_source,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

PASSES = int(os.environ.get("REFINERY_SOAK_PASSES", repeat(5, 100)))
# A uid range of its own (the hostile test uses 61000-63047), so a check for strays
# cannot be confused by another suite's live runs.
CONFIG = SandboxConfig(wall_timeout=20, cpu_seconds=1, memory_mb=256, max_processes=16,
                       max_file_mb=4, max_open_files=64, disk_mb=16, output_bytes=64 * 1024,
                       max_workers=2, uid_first=63100 + (os.getpid() % 64) * 8, uid_count=8)
WALL = {"sleep_forever": 1.0}


def _children(ppid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``ppid``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == ppid and fields[0] != "Z":
                found.append(int(name))
    return found


def _make_dirs() -> tuple[Path, Path]:
    """The sandbox's temp root (traversable by the run's uid: bwrap binds the program dir
    from it) and a world-writable canary directory on the host."""
    tmp = Path(tempfile.mkdtemp(prefix="refinery-soak-"))
    tmp.chmod(0o755)
    canary = Path(tempfile.mkdtemp(prefix="refinery-canary-", dir="/tmp"))
    canary.chmod(0o777)
    (canary / "keep.txt").write_text("untouched\n")
    (canary / "keep.txt").chmod(0o666)
    (canary / "sub").mkdir(mode=0o777)
    return tmp, canary


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name != "refinery-sandbox-uids")


async def test_hostile_corpus_soak_is_contained_and_leaves_nothing(monkeypatch) -> None:
    names = sorted(p.stem for p in HOSTILE.glob("*.py"))
    assert set(names) == set(EXPECTED)

    # The sandbox's temp dirs go to a directory of our own, so leftovers are ours to count.
    tmp, canary = _make_dirs()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    before = _snapshot(canary)
    # In a full session this process already has children (the session's vLLM
    # engine, the math worker): only processes the soak leaves behind count.
    children_before = set(_children(os.getpid()))

    connections: list[bytes] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    secret = "s3cret-" + secrets.token_hex(8)
    marker = "refinery-daemon-" + secrets.token_hex(8)
    monkeypatch.setenv(SECRET_VAR, secret)
    programs = {}
    for name in names:
        src = hostile_source(name, canary=canary, port=port, secret=secret, marker=marker)
        programs[name] = build_program("", src, CHECK, "attack")

    sandbox = Sandbox(CONFIG)

    async def run(name: str) -> tuple[str, RunResult]:
        return name, await sandbox.run_python(programs[name], wall_timeout=WALL.get(name))

    # Interleaved passes, all submitted at once: the sandbox's own pool runs 2 at a time.
    jobs = [run(n) for _ in range(PASSES) for n in names]
    try:
        results = await asyncio.gather(*jobs)
    finally:
        server.close()
        await server.wait_closed()

    try:
        outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        wrong = []
        for name, r in results:
            outcomes[name][r.reason] += 1
            if r.passed or r.mode != "bwrap" or r.reason not in EXPECTED[name]:
                wrong.append((name, r.reason, r.passed, r.stderr[-300:]))
        print(f"\nsandbox soak: {len(results)} runs ({PASSES} passes x {len(names)} programs)")
        for name in names:
            print(f"  {name:16} {dict(outcomes[name])}")
        strays = UidPool(CONFIG.uid_first, CONFIG.uid_count).pids()
        children = [p for p in _children(os.getpid()) if p not in children_before]
        daemons = _processes_with(marker)
        leftovers = _leftovers(tmp)
        print(f"  escapes={len(wrong)} stray processes={len(strays)} children={len(children)} "
              f"daemons={len(daemons)} temp dirs left={len(leftovers)} "
              f"connections={len(connections)}")
        assert len(results) == PASSES * len(names)
        assert wrong == [], wrong[:5]
        assert strays == [] and children == [] and daemons == []
        assert leftovers == []
        assert _snapshot(canary) == before
        assert connections == []
        # The host side still works after the soak.
        r = await sandbox.run_python("print(sum(range(10)))")
        assert r.passed and r.stdout.strip() == "45"
    finally:
        shutil.rmtree(canary, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
