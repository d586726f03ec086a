"""Faults of a running ``refinery serve``: engine death, upstream death, SIGTERM.

Everything is real: ``refinery serve`` and vLLM's own OpenAI server run as
subprocesses on 127.0.0.1 over the embedded model, faults are real signals
(SIGKILL of the engine core process or of the process holding the upstream's
endpoint, SIGTERM of the server), and requests go through the official
``openai`` SDK or raw SSE over httpx. Every request is classified; a request
that ends in anything but a full answer or a well-formed OpenAI error (a 503
body, or an error chunk followed by ``data: [DONE]``) counts as lost, and lost
must be 0.

Each engine start costs 15-40 s on 2 cores, so one server is reused
where the fault allows it (the restarted server also serves the SIGTERM test),
and the module's two engine servers start together: a start is mostly one core
importing vLLM, so the second costs the first test little wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import httpx
import openai
import psutil
import pytest

from tests.servers import ServerProcess, free_port, status
from tests.waiting import wait_until

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m"
BIN = Path(sys.executable).parent
LONG = [{"role": "user", "content": "Write a long story about a dog who learns to sail."}]
SHORT = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
ERROR_KEYS = {"message", "type", "param", "code"}
START_TIMEOUT = 600  # engine starts share 2 cores with other work; generous on purpose


# -- processes ------------------------------------------------------------------------------


def refinery_serve(tmp: Path, *extra: str, nice: int = 0) -> ServerProcess:
    """``refinery serve`` of the embedded model (1 GiB of KV cache), not waited for."""
    port = free_port()
    return ServerProcess([BIN / "refinery", "serve", "--port", str(port), "--model", MODEL,
                          *extra], tmp / f"refinery-{port}.log", port,
                         env={"VLLM_CPU_KVCACHE_SPACE": "1"}, nice=nice)


class EngineServers(NamedTuple):
    """The module's two engine servers, by their --on-engine-death policy."""

    restart: ServerProcess
    exit: ServerProcess


@pytest.fixture(scope="module")
def engine_servers(tmp_path_factory) -> Iterator[EngineServers]:
    tmp = tmp_path_factory.mktemp("faults")
    servers = EngineServers(
        restart=refinery_serve(tmp, "--on-engine-death", "restart", "--graceful-timeout", "120"),
        # the default --on-engine-death exit; niced, its start takes what the first
        # test leaves
        exit=refinery_serve(tmp, nice=10))
    try:
        yield servers
    finally:
        for srv in servers:
            srv.stop()


def alive(procs: list[psutil.Process], timeout: float = 60) -> list[str]:
    """The processes of ``procs`` still running after up to ``timeout`` seconds.

    The wait is for stragglers that are on their way out (multiprocessing's
    resource tracker cleans up shared memory after its parent exits); a true
    orphan is still listed when the wait ends.
    """
    with contextlib.suppress(psutil.Error):
        psutil.wait_procs(procs, timeout=timeout)
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}:{p.name()}")
    return out


def in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("refinery_requests_in_flight"):
            return float(line.split()[-1])
    return 0.0


# -- requests and their outcomes ----------------------------------------------------------


class Load:
    """Runs requests in threads and classifies how each one ended.

    Outcomes: ``answer`` (a full answer with a finish_reason), ``error_503`` (an
    OpenAI error body with status 503), ``error_chunk`` (an error event then
    ``[DONE]``); anything else is recorded as ``lost: ...``.
    """

    def __init__(self, url: str):
        self.url = url
        self.outcomes: dict[str, str] = {}
        self.first_chunk: dict[str, threading.Event] = {}
        self.threads: list[threading.Thread] = []

    def start(self, n_plain: int, n_stream: int, max_tokens: int,
              messages=LONG) -> None:
        for i in range(n_plain):
            self._spawn(f"plain{i}", self._plain, max_tokens, messages)
        for i in range(n_stream):
            name = f"stream{i}"
            self.first_chunk[name] = threading.Event()
            self._spawn(name, self._stream, max_tokens, messages)

    def _spawn(self, name, fn, *args) -> None:
        t = threading.Thread(target=self._guarded, args=(name, fn, *args), daemon=True)
        self.threads.append(t)
        t.start()

    def _guarded(self, name, fn, *args) -> None:
        try:
            self.outcomes[name] = fn(name, *args)
        except Exception as exc:  # anything unexpected is a lost request
            self.outcomes[name] = f"lost: {type(exc).__name__}: {exc}"

    def _plain(self, name: str, max_tokens: int, messages) -> str:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0,
                               timeout=300)
        try:
            r = client.chat.completions.create(model=MODEL, messages=messages,
                                               max_tokens=max_tokens, temperature=0)
        except openai.APIStatusError as exc:
            err = exc.body if isinstance(exc.body, dict) else {}
            if exc.status_code == 503 and set(err) >= ERROR_KEYS and err["message"]:
                return "error_503"
            return f"lost: status {exc.status_code} body {exc.body!r}"
        ch = r.choices[0]
        if ch.finish_reason in ("stop", "length") and ch.message.content:
            return "answer"
        return f"lost: incomplete answer {r!r}"

    def _stream(self, name: str, max_tokens: int, messages) -> str:
        events, done = [], False
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens,
                "temperature": 0, "stream": True}
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                          timeout=300) as r:
            if r.status_code != 200:
                return f"lost: stream status {r.status_code}"
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue  # keep-alive comments
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                assert not done, "event after [DONE]"
                ev = json.loads(data)
                events.append(ev)
                if any((c.get("delta") or {}).get("content") for c in ev.get("choices", [])):
                    self.first_chunk[name].set()
        if not done:
            return f"lost: stream ended without [DONE] after {len(events)} events"
        last = events[-1] if events else {}
        if "error" in last:
            return "error_chunk" if set(last["error"]) >= ERROR_KEYS else f"lost: {last}"
        finish = [c.get("finish_reason") for ev in events for c in ev.get("choices", [])
                  if c.get("finish_reason")]
        text = "".join((c.get("delta") or {}).get("content") or ""
                       for ev in events for c in ev.get("choices", []))
        if finish and finish[-1] in ("stop", "length") and text:
            return "answer"
        return f"lost: stream without an answer or an error ({len(events)} events)"

    def wait_streaming(self, timeout: float = 300) -> None:
        for name, ev in self.first_chunk.items():
            assert ev.wait(timeout), f"{name} never streamed: {self.outcomes.get(name)}"

    def join(self, timeout: float = 300) -> Counter:
        for t in self.threads:
            t.join(timeout)
        assert all(not t.is_alive() for t in self.threads), "a request hung"
        return Counter(o if not o.startswith("lost") else "lost" for o in
                       self.outcomes.values())


def kill_engine_mid_request(srv: ServerProcess) -> tuple[Load, list[psutil.Process]]:
    """Start 2 plain + 2 streaming requests, SIGKILL the engine core while all 4 run."""
    engine_procs = [p for p in srv.descendants() if p.name().startswith("VLLM::")]
    load = Load(srv.url)
    load.start(n_plain=2, n_stream=2, max_tokens=400)
    load.wait_streaming()
    assert wait_until(lambda: in_flight(srv.url) >= 4, seconds=120), "4 requests in flight"
    srv.engine_core().send_signal(signal.SIGKILL)
    return load, engine_procs


def report(kind: str, counts: Counter, load: Load) -> None:
    print(f"\n[faults] {kind}: {dict(counts)} details={load.outcomes}")


# -- tests --------------------------------------------------------------------------------


@pytest.mark.own_engines
def test_engine_death_restart_then_sigterm_drain(engine_servers):
    """Engine core SIGKILLed under load with --on-engine-death restart, then SIGTERM."""
    srv = engine_servers.restart
    try:
        srv.wait_ready(START_TIMEOUT)
        old_core = srv.engine_core().pid
        load, old_procs = kill_engine_mid_request(srv)
        counts = load.join()
        report("engine killed (restart)", counts, load)
        assert counts["lost"] == 0, load.outcomes
        # All four were running when the core died: none can have an answer.
        assert counts == Counter(error_503=2, error_chunk=2), load.outcomes
        # Still dead or already restarting: not ready either way.
        r = httpx.get(srv.url + "/health", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"

        srv.wait_ready(START_TIMEOUT)  # the supervisor built a new engine
        assert srv.proc.poll() is None
        assert srv.engine_core().pid != old_core
        assert alive(old_procs) == []  # the old core's worker was reaped, not orphaned
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        r2 = ok.chat.completions.create(model=MODEL, messages=SHORT, max_tokens=16,
                                        temperature=0)
        assert r2.choices[0].message.content and r2.usage.completion_tokens > 0

        # SIGTERM while 4 streams are mid-answer: they finish, new connections do not get in.
        procs = srv.descendants()
        drain = Load(srv.url)
        drain.start(n_plain=0, n_stream=4, max_tokens=128)
        drain.wait_streaming()
        srv.proc.send_signal(signal.SIGTERM)
        statuses = []

        def refused() -> bool:  # the listener closes on the server's next loop tick
            statuses.append(status(srv.url + "/health"))
            return statuses[-1] != 200

        wait_until(refused, seconds=30, every=0.05)
        counts = drain.join()
        report("SIGTERM drain", counts, drain)
        assert statuses[-1] in (None, 503), statuses  # refused (or 503), not served
        assert counts == Counter(answer=4), drain.outcomes
        assert srv.proc.wait(timeout=120) == 0, srv.tail()
        assert alive(procs) == []
    finally:
        srv.stop()


@pytest.mark.own_engines
def test_engine_death_exit_policy_exits_cleanly(engine_servers):
    """Default policy (exit): in-flight requests fail well-formed, the server exits 3."""
    srv = engine_servers.exit
    try:
        srv.wait_ready(START_TIMEOUT)
        procs = srv.descendants()
        load, _ = kill_engine_mid_request(srv)
        counts = load.join()
        report("engine killed (exit)", counts, load)
        assert counts["lost"] == 0, load.outcomes
        assert counts == Counter(error_503=2, error_chunk=2), load.outcomes
        assert srv.proc.wait(timeout=120) == 3, srv.tail()
        assert "the model engine died" in srv.tail()
        assert alive(procs) == []  # no orphan engine core or worker
        assert status(srv.url + "/health") is None  # gone, not hanging
    finally:
        srv.stop()


def upstream_endpoint(tmp: Path, port: int, target_port: int) -> ServerProcess:
    """A forwarder on ``port`` to vLLM's server: the upstream's endpoint, cheap to kill
    and to bring back (tests/serving/tcp_forwarder.py). Ready once vLLM's /health
    answers through it."""
    srv = ServerProcess([sys.executable, "-m", "tests.serving.tcp_forwarder", str(port),
                         str(target_port)], tmp / f"forwarder-{port}.log", port)
    srv.wait_ready(timeout=60)
    return srv


def test_openai_upstream_stopped_then_back(tmp_path, vllm_server):
    """--backend openai over vLLM's own server: the upstream is SIGKILLed mid-request.

    The upstream's endpoint is a forwarder process in front of the session's vLLM
    server; the SIGKILL hits it, so refinery sees what an upstream's death looks like
    on the wire (every connection closed mid-answer, then refused) and the upstream
    comes back without another engine start.
    """
    up_port = free_port()
    vllm_port = urlsplit(vllm_server).port
    upstream = upstream_endpoint(tmp_path, up_port, vllm_port)
    srv = None
    try:
        srv = refinery_serve(tmp_path, "--backend", "openai", "--base-url",
                             f"http://127.0.0.1:{up_port}/v1")
        srv.wait_ready(START_TIMEOUT)
        load = Load(srv.url)
        load.start(n_plain=2, n_stream=2, max_tokens=400)
        load.wait_streaming()
        assert wait_until(lambda: in_flight(srv.url) >= 4, seconds=120), "4 requests in flight"
        os.killpg(upstream.proc.pid, signal.SIGKILL)
        upstream.proc.wait(30)
        counts = load.join()
        report("upstream killed", counts, load)
        assert counts["lost"] == 0, load.outcomes
        assert counts == Counter(error_503=2, error_chunk=2), load.outcomes
        r = httpx.get(srv.url + "/health", timeout=30)
        assert r.status_code == 503, r.text
        assert "upstream unavailable" in r.json()["error"]["message"]
        refused = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            refused.chat.completions.create(model=MODEL, messages=SHORT, max_tokens=8)
        assert err.value.status_code == 503

        upstream = upstream_endpoint(tmp_path, up_port, vllm_port)  # it comes back
        srv.wait_ready(timeout=60)  # /health probes the upstream again
        r2 = refused.chat.completions.create(model=MODEL, messages=SHORT, max_tokens=16,
                                             temperature=0)
        assert r2.choices[0].message.content
        assert srv.proc.poll() is None  # an upstream outage is not fatal
    finally:
        if srv is not None:
            srv.stop()
        upstream.stop()
