"""The page served by a real uvicorn on loopback (and ``refinery ui`` as a process): a
large trace is drawn off the event loop, a rebound Host name is refused, another local
port cannot log a browser in or out, keys never reach the access log, every /ui response
carries the security headers, and a FIFO in a run never holds the server (SIGTERM
still stops it)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from refinery.ui import UISettings, create_ui_app
from refinery.ui.pages import CSP
from refinery.ui.traceview import MAX_EVENTS
from tests.servers import free_port, on_loopback, start_server, wait_answering
from tests.ui.conftest import RUN

KEY = "sk-page-server-key"
FRAMING = {"x-frame-options": "DENY", "x-content-type-options": "nosniff",
           "referrer-policy": "no-referrer", "cross-origin-opener-policy": "same-origin"}


@pytest.fixture
async def served(recorded_runs) -> AsyncIterator[tuple[str, FastAPI]]:
    """``refinery ui``'s app with a key, over the recorded run, on a real uvicorn."""
    app = create_ui_app(UISettings(api_keys=frozenset({KEY}), runs=recorded_runs),
                        max_body_bytes=64 << 20)
    server, task, url = await start_server(app)
    yield url, app
    server.should_exit = True
    await task


def big_trace(n: int = MAX_EVENTS, samples: int = 4, text: int = 200) -> str:
    """A trace of ``n`` events (a fan of chains), each a call with ``samples`` outputs."""
    output = {"text": "c" * text, "finish_reason": "stop", "prompt_tokens": 3,
              "completion_tokens": 5}
    events = [{"id": f"e{i}", "kind": "generation", "step": "draft",
               "parents": [f"e{i - 1}"] if i % 50 else [], "text": "t" * text,
               "completions": [output] * samples} for i in range(n)]
    return json.dumps({"task_id": "big", "events": events})


def static_waits(url: str, done: threading.Event) -> list[float]:
    """Seconds each request for a static file took, asked one after another until
    ``done``; from a thread of its own, so a blocked server loop cannot pause it."""
    waits = []
    with httpx.Client(base_url=url, timeout=120) as h:
        while not done.is_set():
            asked = time.monotonic()
            assert h.get("/ui/static/ui.css").status_code == 200
            waits.append(time.monotonic() - asked)
            time.sleep(0.02)
    return waits


async def test_a_large_trace_is_drawn_while_other_requests_are_answered(served):
    url, _ = served
    body, done = big_trace(), threading.Event()

    def draw() -> tuple[httpx.Response, float]:
        started = time.monotonic()
        try:
            r = httpx.post(url + "/ui/trace", data={"trace": body}, timeout=120,
                           headers={"Authorization": f"Bearer {KEY}"})
        finally:
            done.set()
        return r, time.monotonic() - started

    (drawn, drawing), waits = await asyncio.gather(asyncio.to_thread(draw),
                                                   asyncio.to_thread(static_waits, url, done))
    assert drawn.status_code == 200 and drawn.text.count("<li>") == MAX_EVENTS
    # Served in between: on the event loop, one would have waited for the whole drawing.
    assert len(waits) >= 2 and max(waits) < drawing / 2, (drawing, waits)


async def test_a_host_name_rebound_to_loopback_is_refused(served):
    url, _ = served
    async with httpx.AsyncClient(base_url=url) as h:
        r = await h.get("/ui/login", headers={"Host": "rebind.attacker.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "untrusted_host"
        assert (await h.get("/ui/login")).status_code == 200


async def test_another_local_port_cannot_log_in_or_out_or_post(served):
    url, app = served
    other = url.rsplit(":", 1)[0] + ":9"
    async with httpx.AsyncClient(base_url=url) as h:
        for path, data in (("/ui/login", {"key": KEY}), ("/ui/logout", {}),
                           ("/ui/trace", {"trace": "{}"})):
            for headers in ({"Origin": other}, {"Sec-Fetch-Site": "same-site"}):
                r = await h.post(path, data=data, headers=headers)
                assert r.status_code == 403, (path, headers)
                assert "set-cookie" not in r.headers
        assert len(app.state.sessions) == 0
        r = await h.post("/ui/login", data={"key": KEY}, headers={"Origin": url})
        assert r.status_code == 303 and len(app.state.sessions) == 1


async def test_keys_never_reach_the_access_log(recorded_runs):
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    app = create_ui_app(UISettings(api_keys=frozenset({KEY}), runs=recorded_runs))
    keep, access = Keep(), logging.getLogger("uvicorn.access")
    async with on_loopback(app, log_level="info") as url, httpx.AsyncClient(base_url=url) as h:
        access.addHandler(keep)  # only now: configuring uvicorn replaced the logger's handlers
        try:
            r = await h.get(f"/ui/login?key={KEY}&next=/ui/runs")
            assert r.status_code == 400 and "set-cookie" not in r.headers
            await h.get(f"/ui/runs?api_key={KEY}")
            r = await h.post("/ui/login", data={"key": KEY})
            assert r.status_code == 303
        finally:
            access.removeHandler(keep)
    assert len(lines) >= 3, lines
    assert not [x for x in lines if KEY in x], lines
    assert "/ui/login?key=[redacted]&next=/ui/runs" in "\n".join(lines)


async def test_every_ui_response_carries_the_security_headers(served):
    url, _ = served
    async with httpx.AsyncClient(base_url=url) as h:
        responses = [await h.get("/ui/login"), await h.get("/ui/runs"),
                     await h.get("/ui/static/ui.css"), await h.get("/ui/static/nope.js"),
                     await h.get("/"), await h.post("/ui/logout"),
                     await h.get("/ui/api/spec?spec=cot")]
    for r in responses:
        for name, value in FRAMING.items():
            assert r.headers.get(name) == value, (r.url, name)
        assert r.headers.get("content-security-policy") == CSP, r.url
        assert "frame-ancestors 'none'" in CSP


def refinery_ui(runs: Path, port: int) -> subprocess.Popen:
    """``refinery ui --runs RUNS --port PORT`` as a process of its own."""
    cli = Path(sys.executable).parent / "refinery"
    return subprocess.Popen([str(cli), "ui", "--runs", str(runs), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_until_up(url: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    wait_answering(url + "/ui/login", proc, seconds, lambda: "" if proc.poll() is None
                   else proc.stdout.read().decode()[-2000:])  # a pipe: read once it ended


def test_a_fifo_results_file_neither_holds_refinery_ui_nor_its_sigterm(recorded_runs,
                                                                        tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(recorded_runs / RUN, runs / RUN)
    fifo = runs / RUN / "results.jsonl"
    fifo.unlink()
    os.mkfifo(fifo)
    port = free_port()
    proc = refinery_ui(runs, port)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc)
        r = httpx.get(url + "/ui/runs", timeout=60)  # the first page may start the worker
        assert r.status_code == 200 and "results.jsonl is not a regular file" in r.text
        assert httpx.get(url + "/ui/login", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    finally:
        if proc.poll() is None:  # a regression: free the reader, then stop it for good
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
    assert proc.returncode is not None
