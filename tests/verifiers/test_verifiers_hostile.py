"""The hostile corpus (tests/verifiers/hostile/*.py) is contained by the sandbox.

Each program defines ``attack()``; the tests are ``check(attack)`` asserting
it returned "escaped". Where an attack's success is visible from inside, the
program asserts it, so a pass would mean an escape. Every program must end as a
failed verdict, for the expected reason (a limit, a refused operation), while
the host keeps working; afterwards no process of the sandbox's uids or with the
daemon's marker remains, no file of a world-writable host directory changed,
and a listener on 127.0.0.1 saw no connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from refinery.strategies.execution import Execution, execute, execution_sandbox
from refinery.verifiers.code import build_program
from refinery.verifiers.sandbox import RunResult, Sandbox, SandboxConfig
from refinery.verifiers.uid_pool import UidPool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

HOSTILE = Path(__file__).parent / "hostile"
PROJECT = Path(__file__).resolve().parents[2]  # the checkout: host files a program must not read
CHECK = 'def check(f):\n    assert f() == "escaped", "attack did not succeed"\n'
CONFIG = SandboxConfig(wall_timeout=120, cpu_seconds=2, memory_mb=256, max_processes=16,
                       max_file_mb=4, max_open_files=64, disk_mb=16, output_bytes=64 * 1024,
                       max_workers=2, uid_first=61000 + (os.getpid() % 64) * 32, uid_count=16)
SECRET_VAR = "REFINERY_HOSTILE_SECRET"

# program -> the outcomes that count as contained (RunResult.reason)
EXPECTED: dict[str, set[str]] = {
    "fork_bomb": {"exit code 1"},  # BlockingIOError at RLIMIT_NPROC
    "memory_bomb": {"exit code 1"},  # MemoryError at RLIMIT_AS
    "cpu_loop": {"killed by SIGKILL"},  # hard RLIMIT_CPU (SIGXCPU is ignored by it)
    "sleep_forever": {"wall-clock timeout"},
    "huge_output": {"output limit exceeded"},
    "write_outside": {"exit code 1"},
    "read_shadow": {"exit code 1"},
    "env_secret": {"exit code 1"},
    "socket_localhost": {"exit code 1"},
    "network_outside": {"exit code 1"},
    "daemon": {"exited before the end of the program"},
    "kill_parent": {"exit code 1"},
    "fill_disk": {"exit code 1"},
    "big_file": {"exit code 1", "killed by SIGXFSZ"},  # Python ignores SIGXFSZ: EFBIG
    "ctypes_crash": {"killed by SIGSEGV"},
    "thread_bomb": {"exit code 1"},
    "fd_exhaustion": {"exit code 1"},
    "exit_early": {"exited before the end of the program"},
    "os_exit_early": {"exited before the end of the program"},
    "read_host_files": {"exit code 1"},
    "recursion_crash": {"killed by SIGSEGV"},  # C stack overflow
    "privilege": {"exit code 1"},
}
# Every program but the sleeper must be stopped by a limit of its own (RLIMIT_CPU, the
# C stack, ...), not the wall clock: a long wall clock, since a loaded machine runs them
# many times slower; on a quiet one it never matters. The sleeper is what the clock is for.
WALL = {"sleep_forever": 4.0}


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
            out[str(p.relative_to(root))] = (p.stat().st_mode, digest)
        else:
            out[str(p.relative_to(root)) + "/"] = (p.stat().st_mode, "")
    return out


def hostile_source(name: str, *, canary: Path, port: int, secret: str, marker: str) -> str:
    """The corpus program ``name`` with its placeholders filled in."""
    src = (HOSTILE / f"{name}.py").read_text()
    return (src.replace("{{CANARY}}", str(canary)).replace("{{PORT}}", str(port))
            .replace("{{SECRET}}", secret).replace("{{MARKER}}", marker)
            .replace("{{PROJECT}}", str(PROJECT)))


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


class Corpus:
    results: dict[str, Any]  # RunResult, or pot's Execution
    canary: Path
    before: dict[str, tuple[int, str]]
    connections: list[bytes]
    marker: str


@asynccontextmanager
async def attacked(run: Callable[[str, str], Awaitable[Any]]) -> AsyncIterator[Corpus]:
    """Every corpus program's source, filled in, given to ``run`` at once, with a
    world-writable canary directory, a listener on 127.0.0.1, a secret in the
    environment and a daemon marker to look for afterwards."""
    c = Corpus()
    # A host directory anyone may write to: only the jail stands between it and the corpus.
    c.canary = Path(tempfile.mkdtemp(prefix="refinery-canary-"))
    c.canary.chmod(0o777)
    (c.canary / "keep.txt").write_text("untouched\n")
    (c.canary / "keep.txt").chmod(0o666)
    (c.canary / "sub").mkdir(mode=0o777)
    c.before = _snapshot(c.canary)

    c.connections = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        c.connections.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    secret = "s3cret-" + secrets.token_hex(8)
    os.environ[SECRET_VAR] = secret
    c.marker = "refinery-daemon-" + secrets.token_hex(8)
    names = sorted(p.stem for p in HOSTILE.glob("*.py"))

    try:
        results = await asyncio.gather(*(
            run(n, hostile_source(n, canary=c.canary, port=port, secret=secret,
                                  marker=c.marker)) for n in names))
    finally:
        os.environ.pop(SECRET_VAR, None)
        server.close()
        await server.wait_closed()
    c.results = dict(zip(names, results, strict=True))
    try:
        yield c
    finally:
        shutil.rmtree(c.canary, ignore_errors=True)


@pytest_asyncio.fixture(scope="module")
async def corpus():
    """The corpus as the code verifier runs it: each ``attack`` under a check."""
    sandbox = Sandbox(CONFIG)

    async def run(name: str, src: str) -> RunResult:
        return await sandbox.run_python(build_program("", src, CHECK, "attack"),
                                        wall_timeout=WALL.get(name))

    async with attacked(run) as c:
        yield c


@pytest_asyncio.fixture(scope="module")
async def pot_corpus():
    """The corpus as pot runs a model's reply: the attack in a fenced block whose
    ``solution()`` calls it, completed, run and judged by :func:`execute`, in a
    sandbox with pot's own limits (on this test's uids)."""
    sandbox = Sandbox(execution_sandbox().config, uid_first=CONFIG.uid_first,
                      uid_count=CONFIG.uid_count, max_workers=CONFIG.max_workers)

    async def run(name: str, src: str) -> Execution:
        reply = f"```python\n{src}\n\ndef solution():\n    return attack()\n```"
        return await execute(reply, numeric=False, sandbox=sandbox)

    async with attacked(run) as c:
        yield c


def test_corpus_is_complete() -> None:
    names = {p.stem for p in HOSTILE.glob("*.py")}
    assert names == set(EXPECTED)
    assert len(names) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hostile_program_fails_for_the_expected_reason(corpus: Corpus, name: str) -> None:
    r = corpus.results[name]
    assert not r.passed, f"{name} passed: {r.stdout[-300:]!r}"
    assert r.mode == "bwrap"
    assert r.reason in EXPECTED[name], (name, r.reason, r.stderr[-500:])


def test_specific_containment(corpus: Corpus) -> None:
    res = corpus.results
    assert "BlockingIOError" in res["fork_bomb"].stderr
    assert "MemoryError" in res["memory_bomb"].stderr
    assert "secret not found" in res["env_secret"].stderr
    assert "no write outside the sandbox succeeded" in res["write_outside"].stderr
    assert "nothing of the host is readable" in res["read_host_files"].stderr
    assert "FileNotFoundError" in res["read_shadow"].stderr
    assert "only" in res["fill_disk"].stderr and "MB written" in res["fill_disk"].stderr
    assert "unshare(CLONE_NEWUSER) refused" in res["privilege"].stderr
    assert "Too many open files" in res["fd_exhaustion"].stderr
    assert "File too large" in res["big_file"].stderr or res["big_file"].signal is not None
    assert len(res["huge_output"].stdout) + len(res["huge_output"].stderr) <= 64 * 1024 + 64
    # a network namespace of its own: its loopback is not the host's (nobody listens)
    assert "Connection refused" in res["socket_localhost"].stderr
    assert "socket.gaierror" in res["network_outside"].stderr


@pytest.mark.parametrize("path", ["corpus", "pot_corpus"])
def test_nothing_left_behind(path: str, request: pytest.FixtureRequest) -> None:
    corpus: Corpus = request.getfixturevalue(path)
    assert UidPool(CONFIG.uid_first, CONFIG.uid_count).pids() == []
    assert _processes_with(corpus.marker) == []
    assert _snapshot(corpus.canary) == corpus.before
    assert corpus.connections == []


async def test_host_still_works_after_the_corpus(corpus: Corpus) -> None:
    r = await Sandbox(CONFIG).run_python("print(sum(range(10)))")
    assert r.passed and r.stdout.strip() == "45"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_hostile_program_as_pot_runs_it_fails_and_answers_nothing(
        pot_corpus: Corpus, name: str) -> None:
    run = pot_corpus.results[name]
    assert not run.ok and run.answer is None and run.error, (name, run.stdout[-300:])
    assert "escaped" not in run.stdout
    assert "print(solution())" in run.program  # pot's completion of the reply ran

