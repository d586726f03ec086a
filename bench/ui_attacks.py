"""The web page's second security pass: another local user's attacks, measured.

Runs each attack against the page's app (``refinery ui``'s) on 127.0.0.1 and
prints what it got, as JSON; run it at two commits (``PYTHONPATH`` at a
checkout's site) to compare. Another local user is ``nobody`` running Debian's
``/usr/bin/python3`` (stdlib only): the steps ``replay`` and ``drawing`` need root.

- ``race``: ``runs/race`` exchanged with a symlink to an outside run by another
  process (``renameat2`` ``RENAME_EXCHANGE``) during 700 trace requests, then 300
  with an outside file that is not JSON: how often the outside shows;
- ``throttle``: 1,000 wrong keys, then the right one until it is let in; 50 wrong
  keys each with another ``X-Forwarded-For``; 50 wrong bearer keys;
- ``replay``: a login's cookie replayed by ``nobody`` with ``Sec-Fetch-Site:
  same-origin``;
- ``drawing``: ``nobody``'s 8 parallel 80,000-event posts, then the user's small
  trace page;
- ``listing``: 140 runs (113 MB of results) loaded 3 times warm, a static file
  asked for meanwhile;
- ``names``: a 300-byte run name, hidden and too-deep runs, two malformed Hosts.

    sudo python bench/ui_attacks.py [race throttle replay drawing listing names]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from fastapi.testclient import TestClient

from refinery.ui import UISettings, create_ui_app

OUT = {}
TMP = Path(tempfile.mkdtemp())
SYS_PY = "/usr/bin/python3"


def serve(app, **opts):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", **opts)
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, t


def write_run(path, text, trace_line=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"model": "m", "dataset": {"name": "toy"}, "strategy": {"spec": "cot"}})
    )
    (path / "results.jsonl").write_text(
        json.dumps({"id": "RACE", "passed": True, "prediction": text}) + "\n"
    )
    trace = {"task_id": "RACE", "strategy": "cot", "model": "m", "events": [], "error": text}
    (path / "traces.jsonl").write_text((trace_line or json.dumps(trace)) + "\n")


SWAP = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b, end = sys.argv[1].encode(), sys.argv[2].encode(), time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    libc.renameat2(-100, a, -100, b, 2)
"""


def race():
    for kind, n in (("trace", 700), ("raw", 300)):
        root = TMP / f"race-{kind}" / "runs"
        write_run(root / "race", "INSIDE-VISIBLE")
        outside = root.parent / "outside"
        write_run(
            outside,
            "OUTSIDE-SECRET",
            '{"task_id": "RACE", "events": "PASSWORD=hunter2"}' if kind == "raw" else None,
        )
        (root / "race-link").symlink_to(outside, target_is_directory=True)
        c = TestClient(
            create_ui_app(UISettings(runs=root, draw_in_process=False)),
            raise_server_exceptions=False,
        )
        sw = subprocess.Popen(
            [sys.executable, "-c", SWAP, str(root / "race"), str(root / "race-link"), "300"]
        )
        bodies = [c.get("/ui/trace?run=race&task=RACE").text for _ in range(n)]
        sw.kill()
        sw.wait()
        word = "OUTSIDE-SECRET" if kind == "trace" else "hunter2"
        OUT[f"race {kind}: outside served / requests"] = f"{sum(word in b for b in bodies)} / {n}"


def throttle():
    app = create_ui_app(UISettings(api_keys=frozenset({"RIGHT"}), runs=TMP))
    url, server, t = serve(app)  # uvicorn's own defaults: what the CLI passed before
    with httpx.Client(base_url=url) as h:
        t0 = time.monotonic()
        st = [h.post("/ui/login", data={"key": f"g{i}"}).status_code for i in range(1000)]
        OUT["throttle: 1,000 wrong keys, time"] = (
            f"{time.monotonic() - t0:.1f} s, {st.count(401)} answered 401, {st.count(429)} 429"
        )
        last = time.monotonic()
        r = h.post("/ui/login", data={"key": "RIGHT"}, follow_redirects=False)
        OUT["throttle: the right key right after"] = r.status_code
        while r.status_code != 303 and time.monotonic() - last < 90:
            time.sleep(0.5)
            r = h.post("/ui/login", data={"key": "RIGHT"}, follow_redirects=False)
        OUT["throttle: the right key accepted after the last wrong one"] = (
            f"{time.monotonic() - last:.1f} s ({r.status_code})"
        )
    server.should_exit = True
    t.join()
    app = create_ui_app(UISettings(api_keys=frozenset({"RIGHT"}), runs=TMP))
    try:
        from refinery.serving.clients import uvicorn_proxy_options

        opts = uvicorn_proxy_options(frozenset())
    except ImportError:
        opts = {}
    url, server, t = serve(app, **opts)
    with httpx.Client(base_url=url) as h:
        st = [
            h.post(
                "/ui/login", data={"key": "g"}, headers={"X-Forwarded-For": f"198.51.100.{i}"}
            ).status_code
            for i in range(50)
        ]
        OUT[
            "throttle: 50 wrong keys, each another X-Forwarded-For: answered 401 (not throttled)"
        ] = st.count(401)
        st = [
            h.get("/ui/runs", headers={"Authorization": f"Bearer g{i}"}).status_code
            for i in range(50)
        ]
        OUT["throttle: 50 wrong bearer keys on /ui/runs: answered 401 (not throttled)"] = st.count(
            401
        )
    server.should_exit = True
    t.join()




def replay():
    app = create_ui_app(UISettings(api_keys=frozenset({"RIGHT"}), runs=TMP))
    url, server, t = serve(app)
    with httpx.Client(base_url=url) as h:
        h.post("/ui/login", data={"key": "RIGHT"})
        cookie = "; ".join(f"{k}={v}" for k, v in h.cookies.items())
    out = subprocess.run(
        [SYS_PY, "-c", REPLAY, url, cookie], user=65534, cwd="/", capture_output=True, text=True
    ).stdout
    OUT["cookie replayed by another user (nobody): /ui/runs, /ui/api/spec"] = out.strip()
    server.should_exit = True
    t.join()




def drawing(runs):
    app = create_ui_app(UISettings(runs=runs))
    url, server, t = serve(app)
    with httpx.Client(base_url=url, timeout=300) as h:
        h.get("/ui/trace?run=toy-sc&task=p-loop")  # the worker started
        fl = subprocess.Popen(
            [SYS_PY, "-c", FLOOD, url, "8"], user=65534, cwd="/", stdout=subprocess.PIPE, text=True
        )
        fl.stdout.readline()
        time.sleep(1.0)  # the posts are in
        t0 = time.monotonic()
        r = h.get("/ui/trace?run=toy-sc&task=p-loop")
        OUT["drawing: another client's small trace page during 8 x 80,000-event posts"] = (
            f"{r.status_code} in {time.monotonic() - t0:.2f} s"
        )
        out, _ = fl.communicate(timeout=300)
        OUT["drawing: the 8 posts' statuses"] = [status for status, _ in json.loads(out)]
    server.should_exit = True
    t.join()


def listing():
    root = TMP / "many"
    rows = "".join(
        json.dumps(
            {
                "id": f"p{j}",
                "index": j,
                "passed": j % 2 == 0,
                "prompt": "x" * 700,
                "text": "y" * 1200,
                "usage": {"total_tokens": 10, "calls": 1},
            }
        )
        + "\n"
        for j in range(400)
    )
    for i in range(140):
        d = root / f"run-{i:03d}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(
            json.dumps({"model": "m", "dataset": {"name": "toy"}, "strategy": {"spec": "cot"}})
        )
        (d / "results.jsonl").write_text(rows)
    OUT["listing: 140 runs, results bytes"] = (
        f"{sum(f.stat().st_size for f in root.rglob('results.jsonl')) / 1e6:.1f} MB"
    )
    app = create_ui_app(UISettings(runs=root))
    url, server, t = serve(app)
    done, waits = threading.Event(), []

    def static():
        with httpx.Client(base_url=url) as s:
            while not done.is_set():
                a = time.monotonic()
                s.get("/ui/static/ui.css")
                waits.append(time.monotonic() - a)
                time.sleep(0.01)

    with httpx.Client(base_url=url, timeout=300) as h:
        h.get("/ui/runs")
        st = threading.Thread(target=static)
        st.start()
        times = []
        for _ in range(3):
            a = time.monotonic()
            h.get("/ui/runs")
            times.append(time.monotonic() - a)
        done.set()
        st.join()
    OUT["listing: 140 runs, 3 warm loads"] = ", ".join(f"{x:.2f}" for x in times) + " s"
    OUT["listing: static file while they load, max"] = (
        f"{max(waits) * 1000:.0f} ms ({len(waits)} requests)"
    )
    server.should_exit = True
    t.join()


def names(runs):
    shutil.copytree(runs / "toy-sc", runs / ".hidden" / "run")
    shutil.copytree(runs / "toy-sc", runs / "a" / "b" / "c" / "d" / "deeprun")
    c = TestClient(
        create_ui_app(UISettings(runs=runs, draw_in_process=False)), raise_server_exceptions=False
    )
    r = c.get("/ui/run?path=" + "A" * 300)
    OUT["a 300-byte run name"] = (
        f"{r.status_code}, CSP header {'content-security-policy' in r.headers}"
    )
    OUT["hidden and too-deep runs by name"] = [
        c.get(f"/ui/run?path={n}").status_code for n in (".hidden/run", "a/b/c/d/deeprun")
    ]
    url, server, t = serve(create_ui_app(UISettings(runs=runs)))
    with httpx.Client(base_url=url) as h:
        OUT["Host [::1]attacker.example, 127.0.0.1:80@attacker.example"] = [
            h.get("/ui/login", headers={"Host": x}).status_code
            for x in ("[::1]attacker.example", "127.0.0.1:80@attacker.example")
        ]
    server.should_exit = True
    t.join()


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get("TESTS_ROOT", str(Path(__file__).parents[1])))
    from tests.ui.conftest import record_run
    from tests.ui.test_local_users import FLOOD, REPLAY

    runs = TMP / "rec"
    asyncio.run(record_run(runs / "toy-sc"))
    os.chmod(TMP, 0o755)
    for step in sys.argv[1:] or ["race", "throttle", "replay", "drawing", "listing", "names"]:
        fn = globals()[step]
        fn(runs) if step in ("drawing", "names") else fn()
        print(json.dumps({k: v for k, v in OUT.items()}, indent=1), flush=True)
        OUT.clear()
