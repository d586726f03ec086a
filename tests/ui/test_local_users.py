"""What another user of the same machine can do to the page, tried for real: their
programs run as ``nobody`` (Debian's own Python, stdlib only) against a real uvicorn
on loopback, beside the user's Chromium.

- A cookie another port's server received from the user's browser (browsers send
  a host's cookies to all its ports) opens nothing when replayed: the session is
  bound to the local user who logged in.
- Eight parallel 80,000-event trace posts take at most their share of the drawing
  worker: the user's own small trace page is drawn next, not after all eight.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import async_playwright

from refinery.serving.clients import LOOPBACK, ClientId
from refinery.ui import UISettings, create_ui_app
from refinery.ui.drawing import DRAWER
from tests.servers import on_loopback
from tests.ui.conftest import RUN

pytestmark = pytest.mark.timeout(300)
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by nobody, unlike the test's venv
KEY = "sk-local-users"

REPLAY = """
import json, sys, urllib.request, urllib.error
url, cookie = sys.argv[1], sys.argv[2]
out = []
for path in ("/ui/runs", "/ui/api/spec?spec=cot"):
    req = urllib.request.Request(url + path, headers={
        "Cookie": cookie, "Sec-Fetch-Site": "same-origin", "Origin": url})
    try:
        out.append(urllib.request.urlopen(req, timeout=60).status)
    except urllib.error.HTTPError as exc:
        out.append(exc.code)
print(json.dumps(out))
"""

FLOOD = """
import json, sys, time, urllib.parse, urllib.request, urllib.error
from concurrent.futures import ThreadPoolExecutor
url, n = sys.argv[1], int(sys.argv[2])
trace = json.dumps({"task_id": "flood", "events": [{"kind": "step"}] * 80000})
body = urllib.parse.urlencode({"trace": trace}).encode()
def post(_):
    req = urllib.request.Request(url + "/ui/trace", data=body, headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    try:
        status = urllib.request.urlopen(req, timeout=280).status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return status, time.monotonic()
print("posting", flush=True)
with ThreadPoolExecutor(n) as pool:
    print(json.dumps(list(pool.map(post, range(n)))))
"""


def as_nobody(script: str, *args: str) -> subprocess.Popen:
    """``script`` run by another local user (``nobody``), its output piped."""
    if os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.skip("needs root (to run as nobody) and Debian's python3")
    return subprocess.Popen([SYSTEM_PYTHON, "-c", script, *args], user=NOBODY, cwd="/",
                            stdout=subprocess.PIPE, text=True)


def chromium() -> str:
    path = os.environ.get("REFINERY_CHROMIUM") or shutil.which("chromium")
    if not path:
        pytest.fail("no chromium on PATH: `make setup` installs Debian's (system-packages)")
    return path


async def recorded_cookies(seen: list[str]) -> AsyncIterator[str]:
    """A server on another loopback port whose page records the Cookie headers sent."""

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        seen.append(dict(scope["headers"]).get(b"cookie", b"").decode())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"<p>another user's page</p>"})

    async with on_loopback(app) as url:
        yield url


async def test_a_cookie_another_port_received_opens_nothing_for_another_user(
        recorded_runs) -> None:
    page_app = create_ui_app(UISettings(api_keys=frozenset({KEY}), runs=recorded_runs,
                                        draw_in_process=False))
    seen: list[str] = []
    async with on_loopback(page_app) as url, async_playwright() as p:
        async for other in recorded_cookies(seen):
            browser = await p.chromium.launch(executable_path=chromium(), headless=True)
            page = await browser.new_page()
            await page.goto(url + "/ui/login")
            await page.fill("#key", KEY)
            await page.click("#login")
            await page.wait_for_url(url + "/ui")
            await page.goto(other + "/")  # the user opens the other user's page
            await browser.close()
            break
        stolen = next(c for c in seen if "refinery_session_" in c)
        replay = as_nobody(REPLAY, url, stolen)
        out, _ = await asyncio.to_thread(replay.communicate, timeout=120)
        assert json.loads(out) == [401, 401]  # the other user: nothing opens
        async with httpx.AsyncClient(base_url=url, timeout=60) as h:  # the user's own
            r = await h.get("/ui/runs", headers={"Cookie": stolen})  # program: no boundary
            assert r.status_code == 200 and RUN in r.text


async def test_another_users_flood_of_posts_holds_back_a_page_by_one_drawing(
        recorded_runs) -> None:
    app = create_ui_app(UISettings(runs=recorded_runs))
    flooder = ClientId(LOOPBACK, NOBODY)
    async with on_loopback(app) as url:
        flood = as_nobody(FLOOD, url, "8")
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "posting\n"
            deadline = time.monotonic() + 120  # the flood admitted: two drawings' worth
            while DRAWER.admitted().get(flooder, 0) < 4 << 20:
                assert time.monotonic() < deadline, DRAWER.admitted()
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=url, timeout=280) as h:
                r = await h.get(f"/ui/trace?run={RUN}&task=p-loop")
                page_done = time.monotonic()
            out, _ = await asyncio.to_thread(flood.communicate, timeout=280)
        finally:
            if flood.poll() is None:
                flood.kill()
                flood.wait()
    assert r.status_code == 200 and "p-loop" in r.text
    results = json.loads(out)
    statuses = sorted(status for status, _ in results)
    assert 429 in statuses and statuses.count(200) >= 2, statuses
    drawn = sorted(done for status, done in results if status == 200)
    assert page_done < drawn[1], (page_done, drawn)  # drawn right after the first
