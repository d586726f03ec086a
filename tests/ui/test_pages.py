"""The pages over a scripted backend and a recorded run, without a browser: what they
show, that model output stays text, that run names cannot leave the runs directory."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from markupsafe import escape

from refinery.engine.trace import read_traces
from refinery.ui import UISettings, create_ui_app
from refinery.ui.pages import CSP
from tests.ui.conftest import HOSTILE, RUN, ui_app


def test_playground_offers_the_model_and_every_preset(client: TestClient) -> None:
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'data-model="smollm2-135m"' in r.text
    assert '<option value="sc(cot, n=8)">sc: sc(cot, n=8)</option>' in r.text
    assert '<script src="/ui/static/playground.js" defer></script>' in r.text


def test_every_page_has_the_strict_headers(client: TestClient) -> None:
    for url in ("/ui", "/ui/runs", f"/ui/run?path={RUN}", "/ui/trace", "/ui/run?path=nope"):
        r = client.get(url)
        assert r.headers["content-security-policy"] == CSP, url
        assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "no-referrer"


def test_runs_page_lists_the_run_with_its_interval_cost_and_plot(client: TestClient) -> None:
    r = client.get("/ui/runs")
    assert r.status_code == 200
    assert f'<a href="/ui/run?path={RUN}">{RUN}</a>' in r.text
    assert "<code>sc(cot, n=2)</code>" in r.text
    assert "66.7% <span class=\"muted\">(20.8–93.9)</span>" in r.text  # 2 of 3 right
    assert "<svg" in r.text and "toy: accuracy vs. tokens per problem" in r.text
    assert 'class="point on-front"' in r.text  # one run: it is the front


def test_run_page_lists_problems_right_and_wrong_with_links_to_traces(client) -> None:
    r = client.get(f"/ui/run?path={RUN}")
    assert r.status_code == 200
    assert r.text.count('<tr class="right">') == 2 and r.text.count('<tr class="wrong">') == 1
    assert f'href="/ui/trace?run={RUN}&amp;task=p-hostile"' in r.text
    assert "<td>5</td>" in r.text  # the wrong one's gold


def test_model_output_is_escaped_text_everywhere(client: TestClient) -> None:
    for url in (f"/ui/trace?run={RUN}&task=p-hostile", f"/ui/run?path={RUN}"):
        body = client.get(url).text
        assert "<script>alert" not in body and "<img src=x" not in body, url
    trace_page = client.get(f"/ui/trace?run={RUN}&task=p-hostile").text
    assert str(escape(HOSTILE)) in trace_page  # shown literally, as text


def test_trace_page_marks_the_loop_stop_the_answer_and_the_chosen(client) -> None:
    body = client.get(f"/ui/trace?run={RUN}&task=p-loop").text
    assert '<span class="loop">loop stop</span>' in body
    assert 'class="call generation is-loop"' in body
    assert '<span class="role role-loop_retry">loop_retry</span>' in body
    assert body.count('<span class="badge answer">answer</span>') == 2  # legend + the select
    assert '<span class="badge chosen">chosen</span>' in body
    assert "none <span class=\"muted\">(spec's worst case 1)</span>" in body  # no budget


def test_posted_trace_renders_against_the_servers_caps(client, recorded_runs: Path) -> None:
    [trace] = [t for t in read_traces(recorded_runs / RUN / "traces.jsonl")
               if t.task_id == "p-loop"]
    r = client.post("/ui/trace", data={"trace": trace.model_dump_json(), "source": "playground"})
    assert r.status_code == 200
    assert "from the playground" in r.text and "<td class=\"n\">512" in r.text  # max calls
    assert '<td class="n">900</td>' in r.text  # max seconds, 900.0 in the config
    pasted = client.post("/ui/trace", data={"trace": trace.model_dump_json()})
    assert "from pasted" in pasted.text and "<td class=\"n\">512" not in pasted.text


def test_a_posted_non_trace_is_a_400_page(client: TestClient) -> None:
    for text in ("not json", json.dumps({"events": []}), ""):
        r = client.post("/ui/trace", data={"trace": text})
        assert r.status_code == 400 and "not a refinery trace" in r.text
    r = client.post("/ui/trace", content=b'{"trace": 1}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "expected a form" in r.text


def test_run_names_cannot_leave_the_runs_directory(client, recorded_runs: Path) -> None:
    (recorded_runs.parent / "outside").mkdir(exist_ok=True)
    (recorded_runs.parent / "outside" / "config.json").write_text("{}")
    for name in ("../outside", "/etc", "nope", f"{RUN}/../../outside", ""):
        r = client.get("/ui/run", params={"path": name})
        assert r.status_code == 404, name
        assert "no run named" in r.text
    r = client.get("/ui/trace", params={"run": RUN, "task": "no-such-task"})
    assert r.status_code == 404 and "no trace of task" in r.text


def test_a_server_without_runs_says_how_to_give_it_some(recorded_runs: Path) -> None:
    client = TestClient(ui_app(None))
    assert "--runs DIR" in client.get("/ui/runs").text
    r = client.get(f"/ui/run?path={RUN}")
    assert r.status_code == 404 and "without a runs directory" in r.text


def test_refinery_ui_serves_runs_without_an_engine(recorded_runs: Path) -> None:
    client = TestClient(create_ui_app(UISettings(runs=recorded_runs)))
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui/runs"
    assert RUN in client.get("/ui/runs").text
    assert 'id="no-model"' in client.get("/ui").text
    assert client.get(f"/ui/trace?run={RUN}&task=p-loop").status_code == 200
    assert client.get("/v1/models").status_code == 404  # no API here


def test_api_errors_stay_openai_bodies_beside_the_pages(client: TestClient) -> None:
    r = client.get("/v1/nope")
    assert r.status_code == 404 and set(r.json()) == {"error"}
    r = client.get("/ui/api/spec")  # missing parameter: JSON, not a page
    assert r.status_code == 400 and r.json()["error"]["param"] == "query.spec"
    r = client.get("/ui/nope")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")


def test_the_static_files_are_served(client: TestClient) -> None:
    for name in ("ui.css", "playground.js", "trace.js"):
        assert client.get(f"/ui/static/{name}").status_code == 200
