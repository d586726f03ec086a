"""The page behind the server's API keys: a login form that opens a session (an HttpOnly
cookie holding a random token, never the key), accepted by the pages and, on the page's
own same-origin requests, by the API; nothing without a key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from refinery.serving.clients import ClientId, uvicorn_proxy_options
from refinery.serving.dependencies import SESSION_COOKIE, Sessions
from refinery.serving.throttle import KeyThrottle, TooManyWrongKeysError
from refinery.ui import UISettings, create_ui_app
from refinery.ui.auth import safe_next
from tests.servers import on_loopback
from tests.ui.conftest import RUN, ui_app

KEY = "sk-test-key"
PAGES = ["/ui", "/ui/runs", f"/ui/run?path={RUN}", f"/ui/trace?run={RUN}&task=p-loop",
         "/ui/trace"]
CHAT = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "2+2?"}],
        "max_tokens": 8}
COOKIE = f"{SESSION_COOKIE}_80"  # TestClient's server listens on port 80
PAGE_SCRIPT = {"Sec-Fetch-Site": "same-origin"}  # what a browser adds to the page's fetch


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
    assert COOKIE not in r.cookies and "set-cookie" not in r.headers


def test_login_opens_a_session_whose_cookie_is_not_the_key(locked) -> None:
    r = locked.post("/ui/login", data={"key": KEY, "next": "/ui/runs"},
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/runs"
    cookie = r.headers["set-cookie"]
    token = r.cookies[COOKIE]
    assert KEY not in cookie and len(token) >= 40 and token != KEY
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Max-Age=43200" in cookie
    for url in PAGES:
        assert locked.get(url).status_code == 200, url
    assert locked.get("/ui/api/spec?spec=cot", headers=PAGE_SCRIPT).json()["ok"]
    assert locked.get("/v1/models", headers=PAGE_SCRIPT).status_code == 200
    r = locked.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=PAGE_SCRIPT)
    assert r.status_code == 200 and "data: [DONE]" in r.text


def test_the_api_takes_the_session_only_on_the_pages_own_requests(locked) -> None:
    locked.post("/ui/login", data={"key": KEY})
    own = {"Origin": "http://testserver"}  # a browser without Sec-Fetch-Site
    assert locked.get("/v1/models", headers=own).status_code == 200
    for headers in ({}, {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "http://testserver:9999"}):
        assert locked.get("/v1/models", headers=headers).status_code == 401, headers
        assert locked.get("/ui/api/spec?spec=cot", headers=headers).status_code == 401
    assert locked.get("/ui/runs").status_code == 200  # a page load needs no evidence


def test_a_key_in_the_address_is_refused_unread(locked) -> None:
    for key in (KEY, "nope"):
        r = locked.get(f"/ui/login?key={key}&next=/ui/runs", follow_redirects=False)
        assert r.status_code == 400 and "not used" in r.text
        assert "set-cookie" not in r.headers
        assert KEY not in r.text
    assert locked.get("/ui/runs").status_code == 401


def test_the_bearer_header_opens_pages_too(locked: TestClient) -> None:
    r = locked.get("/ui/runs", headers={"Authorization": "Bearer other"})
    assert r.status_code == 200


def test_logout_ends_the_session_for_whoever_still_holds_its_token(locked) -> None:
    locked.post("/ui/login", data={"key": KEY})
    token = locked.cookies[COOKIE]
    r = locked.post("/ui/logout", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert f'{COOKIE}=""' in r.headers["set-cookie"]
    assert locked.get("/ui").status_code == 401
    locked.cookies.set(COOKIE, token)  # a copy of the cookie taken before logout
    assert locked.get("/ui").status_code == 401


USER, OTHER_USER = ClientId("loopback", 1000), ClientId("loopback", 1001)


def test_a_session_expires_and_a_removed_key_ends_its_sessions() -> None:
    now = [1000.0]
    store = Sessions(ttl=60, clock=lambda: now[0])
    token = store.open(KEY, USER)
    assert store.key_id(token, USER) is not None and KEY not in store.key_id(token, USER)
    now[0] += 61
    assert store.key_id(token, USER) is None
    assert store.key_id("made-up", USER) is None and store.key_id(None, USER) is None
    full = Sessions(limit=2)
    first = full.open(KEY, USER)
    full.open(KEY, USER), full.open(KEY, USER)
    assert len(full) == 2 and full.key_id(first, USER) is None  # the oldest made room


def test_a_session_idles_out_unused_and_opens_nothing_for_another_client() -> None:
    now = [0.0]
    store = Sessions(ttl=600, idle=60, clock=lambda: now[0])
    token = store.open(KEY, USER)
    for _ in range(5):  # used every 50 s: kept for 250 s, past its idle time
        now[0] += 50
        assert store.key_id(token, USER) is not None
    assert store.key_id(token, OTHER_USER) is None  # the cookie replayed by another user
    assert store.key_id(token, ClientId("203.0.113.9")) is None
    now[0] += 61
    assert store.key_id(token, USER) is None


def test_a_session_of_a_key_the_server_no_longer_has_opens_nothing(recorded_runs) -> None:
    app = ui_app(recorded_runs, api_keys=frozenset({KEY}))
    client = TestClient(app)
    client.post("/ui/login", data={"key": KEY})
    assert client.get("/ui/runs").status_code == 200
    app.state.ui = UISettings(api_keys=frozenset({"rotated"}), runs=recorded_runs)
    assert client.get("/ui/runs").status_code == 401


def frozen_throttle(app) -> list[float]:
    """The app's key throttle on a clock the test moves (its value, in a list)."""
    now = [0.0]
    app.state.key_throttle = KeyThrottle(clock=lambda: now[0])
    return now


def test_wrong_keys_are_throttled_per_client_with_retry_after(locked) -> None:
    frozen_throttle(locked.app)
    statuses = [locked.post("/ui/login", data={"key": f"guess{i}"}).status_code
                for i in range(20)]
    assert statuses == [401] * 5 + [429] * 15
    r = locked.post("/ui/login", data={"key": "guess"}, follow_redirects=False)
    assert r.status_code == 429 and "too many wrong keys" in r.text
    assert r.headers["retry-after"] == "1" and "set-cookie" not in r.headers


def test_after_a_flood_the_right_key_is_refused_until_the_lockout_ends(locked) -> None:
    now = frozen_throttle(locked.app)
    statuses = [locked.post("/ui/login", data={"key": f"guess{i}"}).status_code
                for i in range(1000)]
    assert statuses.count(401) == 5 and statuses.count(429) == 995
    r = locked.post("/ui/login", data={"key": KEY}, follow_redirects=False)
    assert r.status_code == 429 and "set-cookie" not in r.headers  # tells no guesser
    now[0] += 2  # the lockout of the 5th wrong key is over; a 6th doubles it
    assert locked.post("/ui/login", data={"key": "guess"}).status_code == 401
    assert locked.post("/ui/login", data={"key": KEY}).status_code == 429
    now[0] += 60  # within a minute of the last wrong key, the user is let in
    r = locked.post("/ui/login", data={"key": KEY}, follow_redirects=False)
    assert r.status_code == 303 and locked.get("/ui/runs").status_code == 200


def test_bearer_keys_meet_the_same_throttle(locked) -> None:
    frozen_throttle(locked.app)
    wrong = [locked.get("/v1/models", headers={"Authorization": f"Bearer g{i}"}).status_code
             for i in range(10)]
    assert wrong == [401] * 5 + [429] * 5
    right = {"Authorization": f"Bearer {KEY}"}
    assert locked.get("/v1/models", headers=right).status_code == 429
    assert locked.get("/ui/runs", headers=right).status_code == 429
    r = locked.post("/ui/login", data={"key": KEY})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"


def test_the_lockout_doubles_and_is_at_most_half_a_minute() -> None:
    now, a = [0.0], ClientId("a")
    throttle = KeyThrottle(failures=2, window=60, clock=lambda: now[0])
    throttle.failed(a)
    throttle.check(a)  # one wrong key: not yet
    locks = []
    for _ in range(10):
        throttle.failed(a)
        with pytest.raises(TooManyWrongKeysError) as exc:
            throttle.check(a)
        locks.append(exc.value.retry_after)
        now[0] += exc.value.retry_after  # the next guess right when the lockout ends
    assert locks == [1, 2, 4, 8, 16, 30, 30, 30, 30, 30]
    throttle.check(ClientId("b"))  # another client is not held back
    throttle.check(a)
    now[0] += 61  # quiet for a window: the next wrong key starts the count again
    throttle.failed(a)
    throttle.check(a)


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


async def wrong_logins(url: str, n: int, **client: Any) -> list[int]:
    """The statuses of ``n`` wrong logins, each with another ``X-Forwarded-For``."""
    async with httpx.AsyncClient(base_url=url, timeout=60, **client) as h:
        return [(await h.post("/ui/login", data={"key": "guess"},
                              headers={"X-Forwarded-For": f"198.51.100.{i}"})).status_code
                for i in range(n)]


async def test_neither_forwarded_for_nor_another_loopback_address_escapes_the_throttle(
        recorded_runs) -> None:
    app = create_ui_app(UISettings(api_keys=frozenset({KEY}), runs=recorded_runs))
    async with on_loopback(app, **uvicorn_proxy_options(frozenset())) as url:
        assert await wrong_logins(url, 6) == [401] * 5 + [429]
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        assert await wrong_logins(url, 3, transport=other) == [429] * 3
        third = httpx.AsyncHTTPTransport(local_address="127.0.0.3")
        async with httpx.AsyncClient(base_url=url, timeout=60, transport=third) as h:
            r = await h.post("/ui/login", data={"key": KEY}, follow_redirects=False)
            assert r.status_code == 429  # the right key too: the guesser learns nothing


async def test_forwarded_for_is_believed_from_the_addresses_the_operator_lists(
        recorded_runs) -> None:
    app = create_ui_app(UISettings(api_keys=frozenset({KEY}), runs=recorded_runs))
    async with on_loopback(app, **uvicorn_proxy_options(frozenset({"127.0.0.1"}))) as url:
        assert await wrong_logins(url, 8) == [401] * 8  # eight clients behind the proxy
