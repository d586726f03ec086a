"""``/ui/api/spec``: the spec checked as the server would run it, with a did-you-mean."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from refinery.ui.specs import check_spec, suggest
from tests.ui.conftest import ui_app


def spec(client: TestClient, text: str) -> dict:
    r = client.get("/ui/api/spec", params={"spec": text})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_valid_spec_has_its_canonical_form_worst_case_and_graph(client) -> None:
    body = spec(client, "dei(ssr, critique_refine(rounds=3), sage(cot))")
    assert body["ok"] and body["error"] is None
    assert body["canonical"] == "dei(ssr(cot), critique_refine(cot, rounds=3), sage(cot))"
    assert body["worst_case_calls"] > 10
    graph = body["graph"]
    assert graph["name"] == "dei" and [k["name"] for k in graph["inner"]] == [
        "ssr", "critique_refine", "sage"]
    assert graph["inner"][1]["params"] == {"rounds": 3}
    assert graph["calls"] == body["worst_case_calls"]


@pytest.mark.parametrize(("text", "kind", "wrong", "right"), [
    ("sc(cott)", "strategy", "cott", "cot"),
    ("critique_refin", "strategy", "critique_refin", "critique_refine"),
    ("sc(cot, nn=4)", "parameter", "nn", "n"),
    ("dei(ssr, sage(cot, rouns=2))", "parameter", "rouns", "rounds"),
])
def test_an_unknown_name_gets_the_error_and_a_suggestion(client, text, kind, wrong,
                                                         right) -> None:
    body = spec(client, text)
    assert not body["ok"] and body["canonical"] is None
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert body["suggestion"] == {"kind": kind, "wrong": wrong, "suggestion": right}


@pytest.mark.parametrize("text", ["sc(", "zzzzzz", "sc(cot, n='x')", "__import__('os')", ""])
def test_other_errors_have_no_suggestion(client, text) -> None:
    body = spec(client, text)
    assert not body["ok"] and body["suggestion"] is None and body["error"]["message"]


def test_a_preset_name_is_checked_as_the_spec_it_stands_for() -> None:
    client = TestClient(ui_app(presets={"fast": "sc(cot, n=2)", "sc": "sc(cot, n=8)"}))
    body = spec(client, "fast")
    assert body["preset"] == "fast" and body["canonical"] == "sc(cot, n=2)"
    body = spec(client, " sc ")  # as the server strips it
    assert body["preset"] == "sc" and body["canonical"] == "sc(cot)"  # n=8 is the default
    assert spec(client, "sc(cot)")["preset"] is None


def test_the_servers_call_cap_applies() -> None:
    client = TestClient(ui_app(max_spec_calls=5))
    body = spec(client, "sc(cot, n=4)")
    assert body["ok"]
    body = spec(client, "critique_refine(rounds=8)")  # 18 calls at worst
    assert not body["ok"] and "above the limit of 5" in body["error"]["message"]
    assert check_spec("critique_refine(rounds=8)", max_calls=None).ok


def test_suggest_reads_the_parsed_spec_not_the_message() -> None:
    assert suggest("sc(cot)") is None
    assert suggest("sc(") is None
    assert suggest("qqqq") is None  # nothing close
