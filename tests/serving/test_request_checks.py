"""What every request passes before a route, on a real uvicorn on loopback: the Host
allow-list (DNS rebinding), the origin check on state-changing requests (CSRF from
another local port), JSON-only ``/v1`` bodies (415), the security headers on every
response, and redirects that never name the Host they were asked under."""

from __future__ import annotations

import httpx
import pytest

from refinery.serving import ServerConfig
from refinery.serving.config import load_allowed_hosts
from refinery.serving.middleware import host_name, relative_location, same_netloc
from tests.serving.conftest import CHAT, assert_openai_error, chat, scripted

SECURITY = {"x-content-type-options": "nosniff", "x-frame-options": "DENY",
            "referrer-policy": "no-referrer", "cross-origin-opener-policy": "same-origin",
            "cross-origin-resource-policy": "same-origin"}


async def test_a_rebound_host_name_is_refused_before_any_route(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    port = url.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io"):
        r = await client.post(url + CHAT, json=chat(), headers={"Host": host})
        assert r.status_code == 400, host
        assert assert_openai_error(r.json())["code"] == "untrusted_host"
    assert backend.calls == []
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "app.localhost", f"[::1]:{port}"):
        r = await client.get(url + "/v1/models", headers={"Host": host})
        assert r.status_code == 200, host


async def test_configured_host_names_and_the_wildcard_pass(scripted_serve, client):
    url, _ = await scripted_serve(ServerConfig(allowed_hosts=frozenset({"proxy.example"})))
    assert (await client.get(url + "/v1/models", headers={"Host": "proxy.example"})
            ).status_code == 200
    assert (await client.get(url + "/v1/models", headers={"Host": "other.example"})
            ).status_code == 400
    url, _ = await scripted_serve(ServerConfig(allowed_hosts=frozenset({"*"})))
    assert (await client.get(url + "/v1/models", headers={"Host": "other.example"})
            ).status_code == 200


def test_allowed_hosts_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("REFINERY_ALLOWED_HOSTS", " Proxy.Example, ,b.example")
    assert load_allowed_hosts() == {"proxy.example", "b.example"}
    assert ServerConfig().allowed_hosts == {"proxy.example", "b.example"}
    assert load_allowed_hosts("") == frozenset()


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:9999"}, {"Origin": "null"},
    {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"},
])
async def test_a_state_changing_request_from_another_origin_is_403(scripted_serve, client,
                                                                    headers):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(), headers=headers)
    assert r.status_code == 403, r.text
    err = assert_openai_error(r.json())
    assert (err["type"], err["code"]) == ("permission_error", "cross_origin")
    assert backend.calls == []


async def test_same_origin_and_non_browser_requests_pass(scripted_serve, client):
    url, _ = await scripted_serve()
    # A page's own form post under Referrer-Policy: no-referrer carries Origin: null.
    for headers in ({}, {"Origin": url}, {"Sec-Fetch-Site": "same-origin"},
                    {"Sec-Fetch-Site": "none"},
                    {"Sec-Fetch-Site": "same-origin", "Origin": "null"}):
        r = await client.post(url + CHAT, json=chat(max_tokens=4), headers=headers)
        assert r.status_code == 200, (headers, r.text)


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded",
                                  "multipart/form-data; boundary=x", None])
async def test_a_v1_body_that_is_not_json_is_415(scripted_serve, client, kind):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    headers = {"content-type": kind} if kind else {}
    r = await client.post(url + CHAT, content=b'{"model": "x"}', headers=headers)
    assert r.status_code == 415, r.text
    err = assert_openai_error(r.json())
    assert (err["type"], err["code"]) == ("invalid_request_error", "unsupported_media_type")
    assert "application/json" in err["message"]
    assert backend.calls == []


async def test_json_with_a_charset_is_json(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, content=b'{"model": "nope", "messages": []}',
                          headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code in (400, 404) and r.status_code != 415


async def test_every_response_carries_the_security_headers(scripted_serve, client):
    url, _ = await scripted_serve()
    for r in (await client.get(url + "/v1/models"), await client.get(url + "/health"),
              await client.get(url + "/nope"),
              await client.post(url + CHAT, content=b"x", headers={"content-type": "text/plain"}),
              await client.post(url + CHAT, json=chat(), headers={"Origin": "http://x"})):
        for name, value in SECURITY.items():
            assert r.headers.get(name) == value, (r.url, r.status_code, name)


async def test_a_redirect_never_names_the_host_it_was_asked_under(scripted_serve, client):
    url, _ = await scripted_serve(ServerConfig(allowed_hosts=frozenset({"*"})))
    r = await client.get(url + "/v1/models/", headers={"Host": "evil.example"})
    assert r.status_code == 307 and r.headers["location"] == "/v1/models"


def test_header_helpers() -> None:
    assert host_name("LocalHost:8000") == "localhost" and host_name("[::1]:80") == "::1"
    assert host_name("::1") is None and host_name("a.example") == "a.example"  # RFC 3986
    assert same_netloc("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert same_netloc("http://localhost", "localhost:80")
    assert not same_netloc("http://127.0.0.1:8001", "127.0.0.1:8000")
    assert not same_netloc("null", "127.0.0.1:8000")
    assert relative_location("http://evil.example//x?a=1", "evil.example") == "/x?a=1"
    assert relative_location("/ui/runs", "h") == "/ui/runs"
    assert relative_location("https://elsewhere.example/", "h") == "https://elsewhere.example/"


async def test_httpx_sends_the_host_header_we_set(scripted_serve):
    """The tests above depend on httpx sending a Host header as given."""
    url, _ = await scripted_serve(ServerConfig(allowed_hosts=frozenset({"*"})))
    async with httpx.AsyncClient() as h:
        r = await h.get(url + "/v1/models/", headers={"Host": "given.example"})
    assert r.request.headers["host"] == "given.example"
