"""The page behind the server's API keys: a login form that sets an HttpOnly cookie,
accepted by the pages and the API alike; nothing without a key."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from refinery.serving.dependencies import KEY_COOKIE
from refinery.ui import UISettings, create_ui_app
from refinery.ui.auth import safe_next
from tests.ui.conftest import RUN, ui_app

KEY = "sk-test-key"
PAGES = ["/ui", "/ui/runs", f"/ui/run?path={RUN}", f"/ui/trace?run={RUN}&task=p-loop",
         "/ui/trace"]
CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 8}


@pytest.fixture
def locked(recorded_runs) -> TestClient:
    return TestClient(ui_app(recorded_runs, api_keys=frozenset({KEY, "other"})))


def test_without_a_key_every_page_is_the_login_form_with_401(locked: TestClient) -> None:
    for url in PAGES:
        r = locked.get(url)
        assert r.status_code == 401, url
        assert '<form method="post" action="/ui/login"' in r.text
        assert "toy-sc" not in r.text.split("<main>")[1].split('name="next"')[0], url
    r = locked.post("/ui/trace", data={"trace": "{}"})
    assert r.status_code == 401


def test_the_page_api_and_the_api_refuse_with_openai_bodies(locked: TestClient) -> None:
    for r in (locked.get("/ui/api/spec?spec=cot"), locked.get("/v1/models"),
              locked.post("/v1/chat/completions", json=CHAT)):
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_a_wrong_key_is_refused_and_sets_no_cookie(locked: TestClient) -> None:
    r = locked.post("/ui/login", data={"key": "nope", "next": "/ui/runs"},
                    follow_redirects=False)
    assert r.status_code == 401 and "wrong API key" in r.text
    assert KEY_COOKIE not in r.cookies and "set-cookie" not in r.headers
    assert locked.get("/ui/login?key=nope", follow_redirects=False).status_code == 401


def test_login_sets_an_httponly_strict_cookie_that_opens_pages_and_api(locked) -> None:
    r = locked.post("/ui/login", data={"key": KEY, "next": "/ui/runs"},
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/runs"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{KEY_COOKIE}={KEY};")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    for url in PAGES:
        assert locked.get(url).status_code == 200, url
    assert locked.get("/ui/api/spec?spec=cot").json()["ok"]
    assert locked.get("/v1/models").status_code == 200
    r = locked.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200 and "data: [DONE]" in r.text


def test_a_key_in_the_link_logs_in_once_and_leaves_the_address(locked) -> None:
    r = locked.get(f"/ui/login?key={KEY}&next=/ui/runs", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/runs"
    assert locked.get("/ui/runs").status_code == 200


def test_the_bearer_header_opens_pages_too(locked: TestClient) -> None:
    r = locked.get("/ui/runs", headers={"Authorization": "Bearer other"})
    assert r.status_code == 200


def test_logout_drops_the_cookie(locked: TestClient) -> None:
    locked.post("/ui/login", data={"key": KEY})
    r = locked.post("/ui/logout", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert f'{KEY_COOKIE}=""' in r.headers["set-cookie"]
    assert locked.get("/ui").status_code == 401


def test_the_login_form_returns_to_the_page_asked_without_any_key(locked) -> None:
    r = locked.get(f"/ui/trace?run={RUN}&task=p-loop&key=wrong")
    assert r.status_code == 401
    assert f'name="next" value="/ui/trace?run={RUN}&amp;task=p-loop"' in r.text


@pytest.mark.parametrize(("target", "went"), [
    ("/ui/runs?x=1", "/ui/runs?x=1"), ("/ui", "/ui"), (None, "/ui"),
    ("https://evil.example/ui", "/ui"), ("//evil.example/ui", "/ui"), ("/v1/models", "/ui"),
    ("/uix", "/ui"), ("/ui\\..\\x", "/ui"), ("javascript:alert(1)", "/ui"),
])
def test_login_goes_only_to_pages_of_this_server(target, went) -> None:
    assert safe_next(target) == went


def test_without_keys_everything_is_open_and_login_says_so(client: TestClient) -> None:
    assert client.get("/ui").status_code == 200
    r = client.get("/ui/login")
    assert r.status_code == 200 and "no API keys" in r.text
    r = client.post("/ui/login", data={"key": "anything"}, follow_redirects=False)
    assert r.status_code == 303 and "set-cookie" not in r.headers


def test_refinery_ui_takes_keys_too(recorded_runs) -> None:
    client = TestClient(create_ui_app(UISettings(api_keys=frozenset({KEY}),
                                                 runs=recorded_runs)))
    assert client.get("/ui/runs").status_code == 401
    client.post("/ui/login", data={"key": KEY})
    assert client.get("/ui/runs").status_code == 200
