"""Hostile run directories and traces against ``refinery ui``'s app: every malformed
file, line or trace is a note or a 4xx page, never a 500; a FIFO never blocks a read;
traces are found however their JSON was written; a large or deep trace is drawn in
linear time without recursion, and one past the event limit is summarised.

Each test starts from a copy of the recorded run (``conftest.record_run``, the real
runner's files) and spoils one thing in it.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from refinery.engine.trace import Trace, TraceEvent
from refinery.ui import UISettings, create_ui_app, traceview
from refinery.ui.runs import RUN_FILES, line_task_id
from refinery.ui.traceview import MAX_EVENTS, call_tree, trace_view
from tests.ui.conftest import RUN

BAD = "bad"  # the spoiled copy's name


@pytest.fixture
def runs(recorded_runs: Path, tmp_path: Path) -> Path:
    """A runs root holding the recorded run and a copy of it (``bad``) to spoil."""
    root = tmp_path / "runs"
    shutil.copytree(recorded_runs / RUN, root / RUN)
    shutil.copytree(recorded_runs / RUN, root / BAD)
    return root


@pytest.fixture
def ui(runs: Path) -> TestClient:
    # Drawn in the test's process: the caches it counts are this process's.
    return TestClient(create_ui_app(UISettings(runs=runs, draw_in_process=False)),
                      raise_server_exceptions=False)


def spoil_results(runs: Path, line: bytes, at: int = 1) -> None:
    """Put ``line`` into the spoiled run's results as line ``at + 1``."""
    path = runs / BAD / "results.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(at, line)
    path.write_bytes(b"".join(lines))


def note_of(body: str) -> str:
    """The notes list of a page (empty when it has none)."""
    if 'id="notes"' not in body:
        return ""
    return body.split('id="notes"', 1)[1].split("</ul>", 1)[0]


# -- results lines --------------------------------------------------------------------

RESULT_LINES = [
    (b"1\n", "a JSON int, not an object"),
    (b'{"id": "x", "usage": [1, 2], "passed": true}\n', "usage: Input should be a valid"),
    (b'{"id": "x", "usage": {"total_tokens": "lots"}}\n', "usage.total_tokens"),
    (b'{"id": "x", "prompt": "\xff\xfe"}\n', "not UTF-8"),
    (b"{" * 50_000 + b"\n", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested too deeply"),
]


@pytest.mark.parametrize(("line", "reason"), RESULT_LINES)
def test_a_line_that_is_not_a_result_is_a_note_and_the_rest_shows(ui, runs, line, reason):
    spoil_results(runs, line)
    for url in ("/ui/runs", f"/ui/run?path={BAD}"):
        r = ui.get(url)
        assert r.status_code == 200, (url, r.text[-500:])
        note = note_of(r.text)
        assert f"run {BAD}: results.jsonl line 2 is not a result" in note, url
        assert reason in note.replace("&#39;", "'"), note
    page = ui.get(f"/ui/run?path={BAD}").text
    assert page.count('<tr class="right">') == 2 and page.count('<tr class="wrong">') == 1
    assert ui.get(f"/ui/run?path={RUN}").text.count('id="notes"') == 0  # the good run


def test_a_lone_surrogate_in_a_prediction_shows_as_its_escape(ui, runs):
    path = runs / BAD / "results.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0]["prediction"] = "\ud800 four"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ensure_ascii: \ud800
    r = ui.get(f"/ui/run?path={BAD}")
    assert r.status_code == 200
    assert "\\ud800 four" in r.text


# -- config.json ----------------------------------------------------------------------

@pytest.mark.parametrize(("config", "says"), [
    ("[1, 2]", "config.json is a JSON list, not an object"),
    ('{"dataset": "toy"}', "config.json: dataset: Input should be"),
    ("not json at all", "config.json is not JSON"),
])
def test_a_config_that_is_not_a_run_config_is_the_runs_error(ui, runs, config, says):
    (runs / BAD / "config.json").write_text(config)
    r = ui.get("/ui/runs")
    assert r.status_code == 200
    assert f"run {BAD}: {says}" in r.text
    assert f'<a href="/ui/run?path={RUN}">{RUN}</a>' in r.text  # the good run still listed
    r = ui.get(f"/ui/run?path={BAD}")
    assert r.status_code == 200 and says in r.text
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 200 and "loop_retry" in r.text


def test_a_budget_that_is_not_a_budget_is_a_note_on_the_trace(ui, runs):
    path = runs / BAD / "config.json"
    cfg = json.loads(path.read_text())
    cfg["budget"] = {"max_calls": "many"}
    path.write_text(json.dumps(cfg))
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 200
    assert "config.json budget is not a budget" in note_of(r.text)


# -- traces.jsonl ---------------------------------------------------------------------

def rewrite_traces(runs: Path, write: Callable[[dict], str], before: list[str] = ()) -> None:
    """The spoiled run's traces re-serialised by ``write``, after the raw lines ``before``."""
    path = runs / BAD / "traces.jsonl"
    traces = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(f"{x}\n" for x in before) +
                    "".join(write(t) + "\n" for t in traces))


@pytest.mark.parametrize("write", [
    json.dumps,  # Python's default: a space after each colon
    lambda t: json.dumps(t, indent=None, separators=(" , ", " : ")),
    lambda t: json.dumps(t, sort_keys=True),  # task_id no longer the first key
    lambda t: " " + json.dumps(t, ensure_ascii=True, separators=(",", ":")),
])
def test_a_trace_is_found_however_its_json_was_written(ui, runs, write):
    rewrite_traces(runs, write)
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 200, r.text[-400:]
    assert "<code>p-loop</code>" in r.text and "loop_retry" in r.text


def test_lines_that_are_not_traces_before_the_wanted_one_are_skipped(ui, runs):
    rewrite_traces(runs, json.dumps, before=["not json {", "[1, 2, 3]", '{"task_id": 7}',
                                              '"text"'])
    r = ui.get(f"/ui/trace?run={BAD}&task=p-hostile")
    assert r.status_code == 200 and "<code>p-hostile</code>" in r.text


def test_a_trace_line_that_is_not_a_trace_is_a_422_page(ui, runs):
    path = runs / BAD / "traces.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps({"task_id": "p-loop", "events": [{"kind": "nonsense"}]}) + "\n")
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 422
    assert "traces.jsonl line 4, the trace of &#39;p-loop&#39;, is not a refinery trace" in r.text


def test_task_ids_are_read_from_the_head_or_the_whole_line():
    assert line_task_id(b'{"task_id": "a b", "events": []}\n') == ("a b", "")
    assert line_task_id(b'{"events": [], "task_id": "z"}\n') == ("z", "")
    assert line_task_id(b"[1]\n") == (None, "a JSON list, not an object")
    assert line_task_id(b'{"task_id": 3}\n') == (None, "no task_id string")


# -- paths and special files ----------------------------------------------------------

@pytest.mark.parametrize("path", ["x\0", f"{RUN}\0/..", "\0"])
def test_a_nul_in_a_run_name_is_404(ui, path):
    r = ui.get("/ui/run", params={"path": path})
    assert r.status_code == 404 and "no run named" in r.text
    r = ui.get("/ui/trace", params={"run": path, "task": "p-loop"})
    assert r.status_code == 404


def test_a_results_file_linking_outside_the_root_is_not_read(ui, runs, tmp_path):
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"id": "SECRET-ROW", "passed": true}\n')
    (runs / BAD / "results.jsonl").unlink()
    (runs / BAD / "results.jsonl").symlink_to(secret)
    r = ui.get(f"/ui/run?path={BAD}")
    assert r.status_code == 200 and "SECRET-ROW" not in r.text
    assert "leads outside the runs directory" in r.text


def in_time(work: Callable[[], object], release: Path, seconds: float = 10) -> list:
    """``work()`` on a thread; if it is still blocked after ``seconds`` (a FIFO open
    waiting for a writer), open ``release`` for writing to free it, so the test fails
    instead of hanging the suite."""
    got: list = []
    thread = threading.Thread(target=lambda: got.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        try:
            fd = os.open(release, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        except OSError:
            pass
        thread.join(5)
        pytest.fail(f"blocked on the FIFO {release.name}")
    return got


@pytest.mark.parametrize("name", ["results.jsonl", "traces.jsonl", "config.json"])
def test_a_fifo_in_place_of_a_run_file_is_refused_at_once(ui, runs, name):
    path = runs / BAD / name
    path.unlink()
    os.mkfifo(path)
    urls = ["/ui/runs", f"/ui/run?path={BAD}", f"/ui/trace?run={BAD}&task=p-loop"]
    got = in_time(lambda: [ui.get(u) for u in urls], path)
    statuses = [r.status_code for r in got[0]]
    if name == "config.json":  # no regular config.json: not a run directory
        assert statuses == [200, 404, 404] and f"path={BAD}" not in got[0][0].text
    else:
        assert all(s < 500 for s in statuses), statuses
        assert any(f"{name} is not a regular file" in r.text for r in got[0])


def test_a_run_is_read_again_only_when_its_files_change(ui, runs):
    ui.get(f"/ui/run?path={BAD}")
    hits, misses = RUN_FILES.hits, RUN_FILES.misses
    ui.get(f"/ui/run?path={BAD}")
    assert RUN_FILES.hits > hits and RUN_FILES.misses == misses
    path = runs / BAD / "results.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    with open(path, "a") as f:
        f.write(json.dumps({**row, "id": "p-new", "index": 9}) + "\n")
    assert "p-new" in ui.get(f"/ui/run?path={BAD}").text
    assert RUN_FILES.misses == misses + 1  # read again once, the new version replacing the old


# -- large, deep and cyclic traces ----------------------------------------------------

def chain(n: int) -> str:
    """The attack trace: ``n`` steps, each the child of the one before."""
    events = [{"id": f"i{i}", "kind": "step", "parents": [f"i{i - 1}"] if i else []}
              for i in range(n)]
    return json.dumps({"task_id": "chain", "events": events})


def test_a_chain_at_the_event_limit_is_drawn_whole(ui):
    r = ui.post("/ui/trace", data={"trace": chain(MAX_EVENTS)})
    assert r.status_code == 200, r.text[-300:]
    assert r.text.count('<li>') == MAX_EVENTS
    assert r.text.count("<ul>") == MAX_EVENTS - 1  # one level per step
    assert r.text.count("</ul></li>") == MAX_EVENTS - 1


def test_a_trace_past_the_event_limit_is_summarised_with_a_note(ui):
    r = ui.post("/ui/trace", data={"trace": chain(8000)})
    assert r.status_code == 200
    assert "This trace has 8,000 events" in r.text and f"up to {MAX_EVENTS:,}" in r.text
    assert 'id="too-many"' in r.text and "<li>" not in r.text.split('id="tree"')[1]


class CountedReads(list):
    """A list that counts its item reads: the union-find's steps, counted, not timed."""

    reads = 0

    def __getitem__(self, i):
        CountedReads.reads += 1
        return super().__getitem__(i)


def test_the_tree_is_built_in_linear_time(monkeypatch):
    """20,000 chained events: a walk up the chain per event was 2e8 steps (minutes)."""

    class CountedForest(traceview.Forest):
        def __init__(self, n: int):
            super().__init__(n)
            self.up = CountedReads(self.up)

    monkeypatch.setattr(traceview, "Forest", CountedForest)
    CountedReads.reads = 0
    trace = Trace.model_validate_json(chain(20_000))
    roots = call_tree(trace)
    assert 0 < CountedReads.reads < 20 * 20_000, CountedReads.reads
    depth, node = 1, roots[0]
    while node.children:
        depth, node = depth + 1, node.children[0]
    assert len(roots) == 1 and depth == 20_000


def test_a_deep_tree_renders_without_recursion(ui):
    r = ui.post("/ui/trace", data={"trace": chain(1000)})  # the template recursed at ~250
    assert r.status_code == 200 and 'id="call-i999"' in r.text


def test_cycles_and_repeated_ids_draw_every_event_once():
    def step(eid: str, parents: list[str]) -> TraceEvent:
        return TraceEvent(id=eid, kind="step", parents=parents)

    events = [step("a", ["c"]), step("b", ["a"]), step("c", ["b"]), step("a", ["a", "b"]),
              step("d", ["d"]), step("e", ["nope", "d"])]
    view = trace_view(Trace(task_id="t", events=events))
    assert sorted(r.call.id for r in view.rows) == ["a", "a", "b", "c", "d", "e"]
    opened = sum(r.opens for r in view.rows)
    assert opened == sum(r.closes for r in view.rows)  # the markup is balanced


def test_a_deeply_nested_pasted_trace_is_400(ui):
    for text in ("[" * 100_000 + "]" * 100_000,
                 '{"task_id": "t", "events": [], "x": ' + '{"a": ' * 5000 + "1" + "}" * 5001):
        r = ui.post("/ui/trace", data={"trace": text})
        assert r.status_code == 400 and "not a refinery trace" in r.text


# -- names the list does not show -----------------------------------------------------

def test_a_name_over_255_bytes_is_404_with_the_page_headers(ui):
    for url in ("/ui/run?path=" + "A" * 300, f"/ui/trace?run={'A' * 300}&task=p-loop",
                f"/ui/run?path={RUN}/{'B' * 256}"):
        r = ui.get(url)
        assert r.status_code == 404 and "no run named" in r.text, url
        assert r.headers["content-security-policy"].startswith("default-src 'none'")


def test_runs_the_list_does_not_show_are_404(ui, runs):
    shutil.copytree(runs / RUN, runs / ".hidden" / "run")
    shutil.copytree(runs / RUN, runs / "a" / "b" / "c" / "d" / "deeprun")
    shutil.copytree(runs / RUN, runs / "a" / "b" / "shown")
    listed = ui.get("/ui/runs").text
    assert "a/b/shown" in listed and "deeprun" not in listed and ".hidden" not in listed
    assert ui.get("/ui/run?path=a/b/shown").status_code == 200
    for name in (".hidden/run", "a/b/c/d/deeprun", "a//b/shown", "a/b/shown/", "./" + RUN):
        assert ui.get("/ui/run", params={"path": name}).status_code == 404, name
        assert ui.get("/ui/trace", params={"run": name, "task": "p-loop"}).status_code == 404


def test_bad_trace_lines_are_notes_on_the_trace_page(ui, runs):
    rewrite_traces(runs, lambda t: json.dumps(t), before=["not json at all", "[1, 2]"])
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 200
    assert f"run {BAD}: traces.jsonl line 1 is not a trace (not JSON" in note_of(r.text)
    assert f"run {BAD}: traces.jsonl line 2 is not a trace (a JSON list" in r.text


def test_a_trace_line_that_is_no_trace_is_422_without_its_bytes(ui, runs):
    rewrite_traces(runs, lambda t: json.dumps({**t, "events": "PASSWORD=hunter2"}))
    r = ui.get(f"/ui/trace?run={BAD}&task=p-loop")
    assert r.status_code == 422 and "events: Input should be a valid array" in r.text
    assert "hunter2" not in r.text
