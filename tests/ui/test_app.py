"""The page's app as an attacker meets it: ``Host`` values that are not RFC 3986 hosts
are refused on a real loopback socket, and an unexpected error's 500 carries the
security headers as every other answer does."""

from __future__ import annotations

import httpx
import pytest
from fastapi.testclient import TestClient

from refinery.ui import UISettings, create_ui_app
from refinery.ui.pages import CSP
from tests.servers import on_loopback

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("host", [
    "[::1]attacker.example", "127.0.0.1:80@attacker.example", "localhost:80 x",
    "127.0.0.1:8o", "[::1", "[fe80::1%eth0]", "local host", "localhost:123456",
    "attacker.example#.localhost",
])
async def test_a_host_that_is_not_an_rfc_3986_host_is_refused(recorded_runs, host) -> None:
    async with on_loopback(create_ui_app(UISettings(runs=recorded_runs))) as url:
        async with httpx.AsyncClient() as client:
            r = await client.get(url + "/ui/runs", headers={"Host": host})
            assert r.status_code == 400 and r.json()["error"]["code"] == "untrusted_host"
            for good in ("localhost", "[::1]:8000", "127.0.0.1", "app.localhost:1"):
                r = await client.get(url + "/ui/login", headers={"Host": good})
                assert r.status_code == 200, good


def test_an_unexpected_error_is_a_500_with_the_security_headers(recorded_runs) -> None:
    app = create_ui_app(UISettings(runs=recorded_runs))

    @app.get("/ui/fails")
    async def fails() -> None:
        raise ZeroDivisionError("a bug")

    r = TestClient(app, raise_server_exceptions=False).get("/ui/fails")
    assert r.status_code == 500 and r.json()["error"]["message"] == (
        "internal error: ZeroDivisionError")
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["x-content-type-options"] == "nosniff"
