"""Run untrusted Python in a jail: bubblewrap namespaces, a spare uid, rlimits, a wall clock.

Layers, outermost first (each one holds where the one inside it might not):

- ``prlimit``: CPU seconds, address space, processes, file size, open files,
  no core files. Inherited by everything the program starts.
- ``setpriv --reuid U``: the program runs as an unprivileged uid taken from a
  pool, one uid per concurrent run. Root ignores ``RLIMIT_NPROC`` and the
  limit counts *per uid*, so a fork bomb is only held by a uid of its own; a
  shared uid would also let one run's fork bomb starve another run.
- ``bwrap --unshare-all``: no network (an empty network namespace), a pid
  namespace (everything dies with it), read-only ``/usr``, size-capped tmpfs
  for ``/work`` (the cwd), ``/tmp`` and ``/dev/shm`` (nothing else is writable),
  the program itself read-only under ``/sandbox``, a cleared environment, no
  nested user namespaces.
- The host side: a wall-clock timeout that SIGKILLs the whole process group,
  then a sweep that kills any process still owned by the run's uid before the
  uid goes back to the pool (:mod:`~refinery.verifiers.uid_pool`); stdout+stderr
  capped (the run is killed past it).

A tiny driver executes the program and prints a per-run nonce only after the
program's last line ran, so ``sys.exit(0)`` / ``os._exit(0)`` half-way (a
known reward hack) is not a pass.

Where bwrap cannot run, an rlimit-only mode (no namespaces: the program sees
the host filesystem and network) is used only if ``allow_unsandboxed=True``,
with a loud warning; by default the sandbox raises :class:`SandboxError`.

Example:
    >>> import asyncio
    >>> sb = Sandbox(SandboxConfig(wall_timeout=5))
    >>> asyncio.run(sb.run_python("print(6 * 7)")).stdout.strip()
    '42'
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
import warnings
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from refinery.engine.errors import SandboxError
from refinery.verifiers.uid_pool import Lease, UidPool, kill_uid, task_count

log = logging.getLogger(__name__)

__all__ = ["RunResult", "Sandbox", "SandboxConfig"]

Mode = Literal["bwrap", "rlimit"]

# Executes argv[1] as __main__; the nonce (first stdin line, kept in a local of
# _run, not a global the program shares) is printed only when the program
# finished without raising or exiting.
_DRIVER = r"""
import os, sys
def _run():
    import traceback
    nonce = sys.stdin.readline().strip().encode()
    path = sys.argv[1]
    sys.argv = [path]
    def flush():
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except BaseException:
                pass
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec")
    g = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(code, g)
    except SystemExit as e:
        c = e.code
        sys.stderr.write("program exited early: SystemExit(%r)\n" % (c,))
        flush()
        os._exit(c if isinstance(c, int) and 0 <= c < 256 else 1)
    except BaseException:
        traceback.print_exc()
        flush()
        os._exit(1)
    flush()
    os.write(1, b"\n" + nonce + b"\n")
    os._exit(0)
_run()
"""


class SandboxConfig(BaseModel):
    """Limits and policy of a :class:`Sandbox`.

    Example:
        >>> SandboxConfig(wall_timeout=3, memory_mb=256).max_processes
        16
    """

    model_config = ConfigDict(frozen=True)

    wall_timeout: float = Field(10.0, gt=0, description="seconds before the group is killed")
    cpu_seconds: int = Field(10, ge=1, description="RLIMIT_CPU per process")
    memory_mb: int = Field(512, ge=64, description="RLIMIT_AS per process")
    max_processes: int = Field(16, ge=4, description="RLIMIT_NPROC for the run's uid")
    max_file_mb: int = Field(16, ge=1, description="RLIMIT_FSIZE")
    max_open_files: int = Field(64, ge=16, description="RLIMIT_NOFILE")
    disk_mb: int = Field(64, ge=1, description="size of each tmpfs (/work, /tmp, /dev/shm)")
    output_bytes: int = Field(64 * 1024, ge=1024,
                              description="stdout+stderr kept; past it the run is killed")
    max_workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    allow_unsandboxed: bool = False
    python: str = "/usr/bin/python3"
    bwrap: str = Field("bwrap", description="the bubblewrap executable: a name on PATH or a path")
    uid_first: int = Field(60000, ge=1000, description="first uid of the per-run uid pool")
    uid_count: int = Field(256, ge=1)


class RunResult(BaseModel):
    """What happened to one program.

    ``completed`` is true only when the program ran to its last line (the
    driver's nonce was seen); ``passed`` needs that, exit code 0 and no limit hit.
    """

    returncode: int | None
    signal: int | None = None
    completed: bool = False
    timed_out: bool = False
    output_exceeded: bool = False
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    mode: Mode = "bwrap"
    uid: int | None = None

    @property
    def passed(self) -> bool:
        return (self.completed and self.returncode == 0 and not self.timed_out
                and not self.output_exceeded)

    @property
    def reason(self) -> str:
        """One phrase for the outcome."""
        if self.timed_out:
            return "wall-clock timeout"
        if self.output_exceeded:
            return "output limit exceeded"
        if self.signal is not None:
            try:
                return f"killed by {signal.Signals(self.signal).name}"
            except ValueError:
                return f"killed by signal {self.signal}"
        if self.returncode == 0 and not self.completed:
            return "exited before the end of the program"
        if self.returncode != 0:
            return f"exit code {self.returncode}"
        return "passed"


class Sandbox:
    """Runs Python programs in a bubblewrap jail, at most ``max_workers`` at once.

    Example:
        >>> import asyncio
        >>> sb = Sandbox(SandboxConfig(wall_timeout=5, max_workers=2))
        >>> code = "import socket; socket.create_connection(('1.1.1.1', 80))"
        >>> r = asyncio.run(sb.run_python(code))
        >>> r.passed, r.returncode
        (False, 1)
    """

    # (python, bwrap, as_root) -> error or None
    _probe_cache: dict[tuple[str, str, bool], str | None] = {}

    def __init__(self, config: SandboxConfig | None = None, **overrides: object) -> None:
        base = config or SandboxConfig()
        # model_copy(update=) would skip validation; a negative timeout must not slip through
        self.config = (SandboxConfig.model_validate({**base.model_dump(), **overrides})
                       if overrides else base)
        self._root = os.geteuid() == 0
        self._uids = UidPool(self.config.uid_first, self.config.uid_count) if self._root else None
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self._mode: Mode | None = None

    # -- mode ---------------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """``bwrap`` when the jail works here, else ``rlimit`` (if allowed); probes once."""
        if self._mode is None:
            self._mode = self._choose_mode()
        return self._mode

    def _choose_mode(self) -> Mode:
        if not os.path.exists(self.config.python):
            raise SandboxError(f"sandbox interpreter {self.config.python} does not exist")
        error = self._probe()
        if error is None:
            return "bwrap"
        if not self.config.allow_unsandboxed:
            raise SandboxError(
                f"bubblewrap sandbox unavailable ({error}); install bubblewrap "
                "(apt-get install bubblewrap) or set allow_unsandboxed=True to run "
                "model-written code with rlimits only"
            )
        msg = (f"SANDBOX DISABLED: bubblewrap unavailable ({error}); running untrusted code "
               "with rlimits only: it can read host files and reach the network")
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        return "rlimit"

    def _probe(self) -> str | None:
        key = (self.config.python, self.config.bwrap, self._root)
        if key in self._probe_cache:
            return self._probe_cache[key]
        import subprocess

        if shutil.which(self.config.bwrap) is None:
            error: str | None = f"{self.config.bwrap} not found"
        elif self._root and shutil.which("setpriv") is None:
            error = "setpriv not found on PATH"
        else:
            lease = self._uids.acquire() if self._uids else None
            workdir = tempfile.mkdtemp(prefix="refinery-sbx-")
            try:
                os.chmod(workdir, 0o755)
                cmd = self._command("bwrap", workdir, lease.uid if lease else None,
                                    [self.config.python, "-I", "-S", "-c", "pass"])
                p = subprocess.run(cmd, capture_output=True, timeout=30, env=self._outer_env())
                error = None if p.returncode == 0 else (
                    p.stderr.decode(errors="replace").strip()[-300:] or f"exit {p.returncode}")
            except (OSError, subprocess.SubprocessError) as e:
                error = str(e)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                if lease:
                    kill_uid(lease.uid)
                    UidPool.release(lease)
        self._probe_cache[key] = error
        return error

    # -- command ------------------------------------------------------------------------------

    @staticmethod
    def _outer_env() -> dict[str, str]:
        # Nothing of ours crosses into the jail, not even before bwrap clears it.
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

    def _limits(self, uid_in_use: bool) -> list[str]:
        c = self.config
        mb = 1024 * 1024
        nproc = c.max_processes
        if not uid_in_use:
            # Same uid as the host: the limit counts every thread of ours too.
            nproc += task_count(os.getuid())
        return [
            "prlimit",
            f"--cpu={c.cpu_seconds}:{c.cpu_seconds + 1}",
            f"--as={c.memory_mb * mb}",
            f"--nproc={nproc}",
            f"--fsize={c.max_file_mb * mb}",
            f"--nofile={c.max_open_files}",
            "--core=0",
            "--",
        ]

    def _command(self, mode: Mode, workdir: str, uid: int | None, argv: list[str]) -> list[str]:
        cmd = self._limits(uid is not None)
        if uid is not None:
            cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                    "--inh-caps=-all", "--"]
        if mode == "rlimit":
            return cmd + argv
        size = str(self.config.disk_mb * 1024 * 1024)
        jail = [self.config.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
                "--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                jail += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                jail += ["--ro-bind", top, top]
        for f in ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"):
            jail += ["--ro-bind-try", f, f]
        jail += ["--proc", "/proc", "--dev", "/dev",
                 "--size", size, "--tmpfs", "/tmp",
                 "--size", size, "--tmpfs", "/work",
                 "--size", size, "--tmpfs", "/dev/shm",
                 "--ro-bind", workdir, "/sandbox",
                 "--chdir", "/work", "--clearenv",
                 "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
                 "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8",
                 "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
                 "--setenv", "PYTHONIOENCODING", "utf-8",
                 # bwrap's root and /dev are tmpfs with no size cap: make them read-only,
                 # so the only writable places are the capped ones.
                 "--remount-ro", "/dev", "--remount-ro", "/",
                 "--"]
        return cmd + jail + argv

    # -- running ------------------------------------------------------------------------------

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.config.max_workers), loop
        return self._sem

    async def run_python(self, source: str, *, stdin: str = "",
                         wall_timeout: float | None = None) -> RunResult:
        """Run ``source`` as ``__main__`` in the jail and report what happened.

        Never raises for anything the program does; raises :class:`SandboxError`
        only when the sandbox itself cannot run.
        """
        # The first call probes bwrap (a subprocess): off the event loop.
        mode = self._mode or await asyncio.to_thread(lambda: self.mode)
        async with self._semaphore():
            return await self._run(mode, source, stdin, wall_timeout or self.config.wall_timeout)

    async def _run(self, mode: Mode, source: str, stdin: str, wall: float) -> RunResult:
        lease = self._uids.acquire() if self._uids else None
        uid = lease.uid if lease else None
        hostdir = tempfile.mkdtemp(prefix="refinery-sbx-")
        proc: asyncio.subprocess.Process | None = None
        output = _Output(self.config.output_bytes + 64)  # +64: the nonce line
        io: list[asyncio.Future[None]] = []
        start = time.monotonic()
        timed_out = False
        try:
            path, cwd = _prepare_dir(hostdir, source, mode, uid)
            nonce = secrets.token_hex(16)
            cmd = self._command(mode, hostdir, uid, [self.config.python, "-I", "-c", _DRIVER,
                                                     path])
            try:
                proc = await asyncio.create_subprocess_exec(
                    *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, start_new_session=True,
                    env=self._outer_env(), cwd=cwd,
                )
            except OSError as e:
                raise SandboxError(f"could not start the sandbox: {e}") from e
            io += output.start(proc, f"{nonce}\n{stdin}".encode())
            try:
                # The run ends when its first process does: anything it left behind is a
                # stray (a daemon, a forked child holding our pipes) and is killed below.
                await asyncio.wait_for(_exited(proc), timeout=wall)
            except asyncio.TimeoutError:
                timed_out = True
            duration = time.monotonic() - start
        finally:
            # Whatever happened (done, limit, timeout, our caller cancelled): kill the
            # group, then every process left with the run's uid, then reap.
            await _reap(proc, lease, io)
            shutil.rmtree(hostdir, ignore_errors=True)
        return _result(mode, proc.returncode, output, nonce, timed_out, duration, uid)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Return when ``proc`` has exited.

    Not ``proc.wait()``: asyncio only reports an exit once every pipe is closed,
    and a child the program forked may hold them open forever.
    """
    if proc.returncode is not None:
        return
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return  # already gone
    except (AttributeError, OSError):  # no pidfd here (old kernel): poll
        while proc.returncode is None:  # noqa: ASYNC110 - no event exists to wait on
            await asyncio.sleep(0.01)
        return
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _prepare_dir(hostdir: str, source: str, mode: Mode, uid: int | None) -> tuple[str, str | None]:
    """Write the program; return its path as the program sees it and the host cwd to use."""
    os.chmod(hostdir, 0o755)  # the run's uid must read it (bwrap binds it read-only)
    main = os.path.join(hostdir, "main.py")
    with open(main, "w", encoding="utf-8") as f:
        f.write(source)
    os.chmod(main, 0o644)
    if mode == "bwrap":
        return "/sandbox/main.py", None
    # No tmpfs without bwrap: a private writable dir, owned by the run's uid.
    work = os.path.join(hostdir, "work")
    os.mkdir(work, 0o700)
    if uid is not None:
        os.chown(work, uid, uid)
    return main, work


class _Output:
    """stdout and stderr of one run, kept up to ``limit`` bytes together; a run that
    writes past it is killed (its group), so a flood cannot fill our memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.out, self.err = bytearray(), bytearray()
        self.exceeded = False

    def start(self, proc: asyncio.subprocess.Process, stdin: bytes) -> list[asyncio.Future[None]]:
        """Feed ``stdin`` and pump both pipes of ``proc``: the futures doing it."""
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        return [asyncio.ensure_future(_feed(proc.stdin, stdin)),
                asyncio.ensure_future(self._pump(proc, proc.stdout, self.out)),
                asyncio.ensure_future(self._pump(proc, proc.stderr, self.err))]

    async def _pump(self, proc: asyncio.subprocess.Process, stream: asyncio.StreamReader,
                    buf: bytearray) -> None:
        while chunk := await stream.read(65536):
            room = self.limit - len(self.out) - len(self.err)
            buf += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.exceeded = True
                _kill_group(proc)
                return


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
        pipe.close()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _reap(proc: asyncio.subprocess.Process | None, lease: Lease | None,
                io: list[asyncio.Future[None]]) -> None:
    """Kill the run's group and every process left with its uid, then drain and reap."""
    if proc is not None:
        _kill_group(proc)
    if lease is not None:
        kill_uid(lease.uid)
        UidPool.release(lease)
    if proc is None:
        return
    # Drain what the dead wrote. A pipe still held open can only be a writer we
    # could not kill (rlimit mode without a uid of its own): give up on it.
    pending = [t for t in io if not t.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=2.0)
        for t in late:
            t.cancel()
    if proc.returncode is None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), timeout=5.0)


def _result(mode: Mode, returncode: int | None, output: _Output, nonce: str, timed_out: bool,
            duration: float, uid: int | None) -> RunResult:
    """The outcome of a reaped run: complete only if the driver's nonce line ended stdout."""
    stdout = output.out.decode("utf-8", errors="replace")
    marker = f"\n{nonce}\n"
    completed = stdout.endswith(marker) and not output.exceeded and not timed_out
    if completed:
        stdout = stdout[: -len(marker)]
    sig = None
    if returncode is not None and returncode < 0:
        sig = -returncode
    elif mode == "bwrap" and returncode is not None and returncode > 128 and not completed:
        sig = returncode - 128  # bwrap reports a signalled child as 128 + signal
    if timed_out or output.exceeded:
        sig = None  # our own SIGKILL, reported as the limit instead
    return RunResult(
        returncode=returncode, signal=sig, completed=completed, timed_out=timed_out,
        output_exceeded=output.exceeded, stdout=stdout,
        stderr=output.err.decode("utf-8", errors="replace"), duration=duration, mode=mode,
        uid=uid,
    )
