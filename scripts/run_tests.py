"""Run the test suite as two pytest processes side by side: the tests on the session's
engine and servers (marked ``e2e``), and the rest, with the e2e tests that start only
engines of their own (also marked ``own_engines``: CLIs under SIGTERM, servers whose
engine dies).

Why: on a small CPU much of a test run keeps one core busy (an engine start is mostly
one-core imports and loading, a CLI under test imports vLLM on one core, the tests
without an engine are one-core Python) while the session engine's generations take
both; side by side the two groups fill both cores. No session engine is started twice:
the second group uses none. Each process has its own ``--basetemp`` and log; the logs
are printed when both have ended (the other tests first), and the exit status is the
worse of the two (pytest's "no tests collected" counts as a pass when the other process
ran tests).

Example:
    $ python scripts/run_tests.py --durations=30            # what `make test` runs
    $ python scripts/run_tests.py tests/eval -k sigterm     # both groups, filtered
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

GROUPS = {"other": "not e2e or own_engines", "e2e": "e2e and not own_engines"}
NO_TESTS = 5  # pytest's exit status when nothing was collected
HEARTBEAT_SECONDS = 120


def start(name: str, marker: str, args: list[str], work: Path) -> subprocess.Popen:
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
           "--basetemp", str(work / name), *args]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def wait_all(procs: dict[str, subprocess.Popen], began: float) -> dict[str, int]:
    """Wait for every process, saying every few minutes which are still running."""
    last = began
    while any(p.poll() is None for p in procs.values()):
        time.sleep(1)
        if time.monotonic() - last >= HEARTBEAT_SECONDS:
            last = time.monotonic()
            running = [n for n, p in procs.items() if p.poll() is None]
            print(f"[{last - began:.0f} s] running: {', '.join(running)}", flush=True)
    return {name: p.returncode for name, p in procs.items()}


def status(codes: dict[str, int]) -> int:
    ran = [c for c in codes.values() if c != NO_TESTS]
    if not ran:
        return NO_TESTS
    return max(ran)


def main(args: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="refinery-tests-"))
    began = time.monotonic()
    procs = {name: start(name, marker, args, work) for name, marker in GROUPS.items()}
    try:
        codes = wait_all(procs, began)
    except KeyboardInterrupt:
        for p in procs.values():
            p.terminate()
        codes = {name: p.wait() for name, p in procs.items()}
    for name in GROUPS:
        print(f"\n===== {name} tests (exit {codes[name]}) =====", flush=True)
        sys.stdout.write((work / f"{name}.log").read_text(errors="replace"))
    print(f"\nboth groups ended after {time.monotonic() - began:.0f} s", flush=True)
    return status(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
