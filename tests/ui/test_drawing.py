"""Trace pages are drawn in a worker process (``ui.drawing``): the page comes from
another process and its errors come back as their 4xx; the pool is started by the first
drawing, bounded, replaced when its worker dies, and killed when the app shuts down,
a drawing in progress included."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import time
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient

from refinery.engine.errors import OverCapacityError
from refinery.serving import ServerConfig, create_app
from refinery.ui import UISettings, create_ui_app, mount_ui, pages
from refinery.ui.drawing import (
    DRAWER,
    PAGE_COST,
    Drawer,
    DrawingStoppedError,
    DrawingTooLargeError,
)
from tests.ui.conftest import RUN, scripted_backend

pytestmark = pytest.mark.timeout(120)
TRACE = f"/ui/trace?run={RUN}&task=p-loop"


def worker_pid() -> bytes:
    """A drawing that says which process drew it."""
    return str(os.getpid()).encode()


def never_answers() -> bytes:
    """A drawing that never ends (the worker ignores SIGINT): only a kill stops it."""
    while True:
        signal.pause()


def when_exists(path: str) -> bytes:
    """A drawing that ends once ``path`` exists (the test creates it), saying so."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return path.encode()


def touch(path: str) -> None:
    """Make ``path`` exist: the drawings waiting on it end."""
    Path(path).touch()


def allocates(size: int) -> bytes:
    """A drawing that needs ``size`` bytes at once."""
    return bytes(len(bytearray(size)) % 7)


def gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` is still a running process."""
    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    _, alive = psutil.wait_procs(procs, timeout=30)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
async def drawer():
    drawer = Drawer(processes=1, max_cost=2 * PAGE_COST, client_share=2 * PAGE_COST)
    yield drawer
    drawer.close()


async def test_a_drawing_runs_in_another_process_started_by_the_first(drawer) -> None:
    assert drawer.pids() == []
    pid = int(await drawer.draw(worker_pid))
    assert pid != os.getpid() and drawer.pids() == [pid]
    assert int(await drawer.draw(worker_pid)) == pid  # the worker stays for the next page


async def test_the_pool_is_bounded_and_close_kills_a_drawing_in_progress(drawer) -> None:
    stuck = [asyncio.ensure_future(drawer.draw(never_answers)) for _ in range(2)]
    await asyncio.sleep(0)  # one turn of the loop: both have submitted their drawing
    with pytest.raises(OverCapacityError) as refused:
        await drawer.draw(worker_pid)
    assert refused.value.status == 429 and refused.value.code == "drawing_busy"
    pids = drawer.pids()
    drawer.close()
    for task in stuck:
        with pytest.raises(DrawingStoppedError) as stopped:
            await task
        assert stopped.value.status == 503
    assert len(pids) == 1 and gone(pids)
    assert int(await drawer.draw(worker_pid)) not in pids  # a new pool, a new worker


async def test_a_worker_killed_while_drawing_is_a_503_and_the_next_page_is_drawn(
        drawer) -> None:
    stuck = asyncio.ensure_future(drawer.draw(never_answers))
    await asyncio.sleep(0)  # one turn of the loop: the drawing is submitted
    [pid] = drawer.pids()
    os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer would
    with pytest.raises(DrawingStoppedError):
        await stuck
    assert int(await drawer.draw(worker_pid)) != pid


def test_settings_pickle_with_read_only_presets() -> None:
    settings = UISettings.of_server(ServerConfig(api_keys=frozenset({"k"})), runs="runs")
    back = pickle.loads(pickle.dumps(settings))
    assert back == settings and dict(back.presets) == dict(settings.presets)
    with pytest.raises(TypeError):
        back.presets["x"] = "cot"  # type: ignore[index]


def test_the_trace_page_is_drawn_by_the_drawer_unless_settings_say_threads(
        recorded_runs, monkeypatch) -> None:
    monkeypatch.setattr(pages, "DRAWER", Drawer(max_cost=0))  # refuses every drawing
    for in_process, status in ((True, 429), (False, 200)):
        app = create_ui_app(UISettings(runs=recorded_runs, draw_in_process=in_process))
        r = TestClient(app).get(TRACE)
        assert r.status_code == status, (in_process, r.text[:300])
        assert ("p-loop" in r.text) is (status == 200)


def test_a_missing_trace_drawn_in_the_worker_is_still_a_404_page(recorded_runs) -> None:
    r = TestClient(create_ui_app(UISettings(runs=recorded_runs))).get(
        f"/ui/trace?run={RUN}&task=nope")
    assert r.status_code == 404 and "no trace of task" in r.text


@pytest.mark.parametrize("server", ["refinery ui", "refinery serve"])
def test_the_apps_shutdown_kills_the_drawing_process(recorded_runs, server) -> None:
    if server == "refinery ui":
        app = create_ui_app(UISettings(runs=recorded_runs))
    else:  # an app with its own lifespan (the engine's): the drawer's close still runs
        async def factory():
            return scripted_backend()

        app = mount_ui(create_app(ServerConfig(), backend_factory=factory), runs=recorded_runs)
    with TestClient(app) as client:
        assert client.get(TRACE).status_code == 200
        pids = DRAWER.pids()
        assert len(pids) == 1
    assert DRAWER.pids() == [] and gone(pids)


async def test_work_is_admitted_by_cost_and_each_client_to_its_share(tmp_path) -> None:
    drawer = Drawer(max_cost=5 * PAGE_COST, client_share=3 * PAGE_COST)
    release = str(tmp_path / "release")
    try:
        held = [asyncio.ensure_future(drawer.draw(when_exists, release, cost=2 * PAGE_COST,
                                                  client="a"))]
        await asyncio.sleep(0)  # one turn of the loop: admitted
        with pytest.raises(OverCapacityError) as refused:  # past a's share
            await drawer.draw(when_exists, release, cost=2 * PAGE_COST, client="a")
        assert refused.value.code == "drawing_busy"
        held.append(asyncio.ensure_future(drawer.draw(when_exists, release,
                                                      cost=3 * PAGE_COST, client="b")))
        await asyncio.sleep(0)
        with pytest.raises(OverCapacityError):  # within c's share, past the whole
            await drawer.draw(worker_pid, client="c")
        assert drawer.admitted() == {"a": 2 * PAGE_COST, "b": 3 * PAGE_COST}
        touch(release)
        assert await asyncio.gather(*held) == [release.encode()] * 2
        assert drawer.admitted() == {}
        assert int(await drawer.draw(worker_pid, client="c")) in drawer.pids()
    finally:
        drawer.close()


async def test_clients_take_turns_so_a_small_page_waits_for_one_drawing_only(
        tmp_path) -> None:
    drawer = Drawer(max_cost=100 * PAGE_COST, client_share=50 * PAGE_COST)
    flood = [str(tmp_path / f"big-{i}") for i in range(8)]
    try:
        big = [asyncio.ensure_future(drawer.draw(when_exists, path, cost=5 * PAGE_COST,
                                                 client="flood"))
               for path in flood]
        await asyncio.sleep(0)  # all eight admitted, the first one drawing
        small = asyncio.ensure_future(drawer.draw(worker_pid, client="reader"))
        await asyncio.sleep(0)
        touch(flood[0])  # the first large drawing ends...
        # ...and the reader's page is next, before the flood's second (still held):
        # were the pages drawn in the order they came, this would wait forever.
        assert int(await asyncio.wait_for(small, 60)) in drawer.pids()
        assert not any(task.done() for task in big[1:])
        for path in flood[1:]:
            touch(path)
        assert len(await asyncio.gather(*big)) == 8
    finally:
        drawer.close()


async def test_a_page_past_the_workers_memory_is_a_413_and_the_next_is_drawn() -> None:
    drawer = Drawer(memory=1 << 30)
    try:
        with pytest.raises(DrawingTooLargeError) as exc:
            await drawer.draw(allocates, 1 << 30)
        assert exc.value.status == 413 and "more memory" in exc.value.message
        assert await drawer.draw(allocates, 1 << 20) == bytes((1 << 20) % 7)
    finally:
        drawer.close()


@pytest.mark.parametrize(("site", "status"), [
    ("cross-site", 403), ("same-site", 403), ("same-origin", 200), ("none", 200), (None, 200),
])
def test_no_page_reading_runs_is_started_by_another_site(recorded_runs, site, status):
    client = TestClient(create_ui_app(UISettings(runs=recorded_runs, draw_in_process=False)))
    headers = {"Sec-Fetch-Site": site} if site else {}
    for url in (TRACE, "/ui/runs", f"/ui/run?path={RUN}"):
        r = client.get(url, headers=headers)
        assert r.status_code == status, (url, r.text[-300:])
        assert ("this page reads run files" in r.text) is (status == 403)
