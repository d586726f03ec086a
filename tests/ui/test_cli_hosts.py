"""``--allowed-hosts`` of ``refinery serve`` and ``refinery ui``, parsed by the real
command line, decides which ``Host`` names the app it serves answers on loopback: the
flag's names (comma-separated or repeated) and the loopback names get 200, any other
400 ``untrusted_host``; without the flag, ``REFINERY_ALLOWED_HOSTS`` does."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
import uvicorn
from click.testing import CliRunner
from fastapi import FastAPI

from refinery.cli import app as cli
from tests.servers import on_loopback

pytestmark = pytest.mark.timeout(60)


def served(monkeypatch, argv: list[str]) -> tuple[FastAPI, dict]:
    """The app ``refinery ARGV`` serves and the proxy options it gives uvicorn: the
    command runs whole, but uvicorn does not listen (``serve`` runs a
    ``uvicorn.Server``, ``ui`` calls ``uvicorn.run``)."""
    apps: list[tuple[FastAPI, dict]] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: apps.append((self.config.app, {
        "proxy_headers": self.config.proxy_headers,
        "forwarded_allow_ips": self.config.forwarded_allow_ips})))
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: apps.append((app_, {
        k: kw.get(k) for k in ("proxy_headers", "forwarded_allow_ips")})))
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(cli, argv)
    finally:
        signal.signal(signal.SIGTERM, before)  # serve installs its own
    assert result.exit_code == 0, result.output
    [found] = apps
    return found


def served_app(monkeypatch, argv: list[str]) -> FastAPI:
    return served(monkeypatch, argv)[0]


async def statuses(app: FastAPI, hosts: list[str]) -> dict[str, int]:
    """The status of ``GET /ui/login`` under each ``Host``, from a real uvicorn on
    127.0.0.1. Without lifespan: ``serve``'s would start the engine, which the Host
    check does not need."""
    async with on_loopback(app, lifespan="off") as url, httpx.AsyncClient(base_url=url) as h:
        answers = {host: await h.get("/ui/login", headers={"Host": host}) for host in hosts}
    refused = [r for r in answers.values() if r.status_code == 400]
    assert all(r.json()["error"]["code"] == "untrusted_host" for r in refused)
    return {host: r.status_code for host, r in answers.items()}


def command(name: str, tmp_path: Path) -> list[str]:
    return ["serve", "--model", "m"] if name == "serve" else ["ui", "--runs", str(tmp_path)]


@pytest.mark.parametrize("name", ["serve", "ui"])
async def test_allowed_hosts_admits_its_names_and_refuses_others(monkeypatch, tmp_path,
                                                                 name) -> None:
    monkeypatch.setenv("REFINERY_ALLOWED_HOSTS", "env.example")  # the flag overrides it
    argv = [*command(name, tmp_path), "--allowed-hosts", "proxy.example, B.example",
            "--allowed-hosts", "c.example"]
    got = await statuses(served_app(monkeypatch, argv),
                         ["proxy.example", "b.example:8443", "c.example", "localhost:8000",
                          "rebind.attacker.example", "env.example", "example"])
    assert got == {"proxy.example": 200, "b.example:8443": 200, "c.example": 200,
                   "localhost:8000": 200, "rebind.attacker.example": 400,
                   "env.example": 400, "example": 400}


@pytest.mark.parametrize("name", ["serve", "ui"])
async def test_without_the_flag_the_environment_names_the_hosts(monkeypatch, tmp_path,
                                                                name) -> None:
    monkeypatch.setenv("REFINERY_ALLOWED_HOSTS", "env.example")
    got = await statuses(served_app(monkeypatch, command(name, tmp_path)),
                         ["env.example", "proxy.example"])
    assert got == {"env.example": 200, "proxy.example": 400}


def test_the_help_of_both_commands_names_the_flag() -> None:
    for name in ("serve", "ui"):
        result = CliRunner().invoke(cli, [name, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        assert "--allowed-hosts" in result.output and "REFINERY_ALLOWED_HOSTS" in result.output


@pytest.mark.parametrize("name", ["serve", "ui"])
def test_x_forwarded_for_is_believed_only_from_the_listed_addresses(monkeypatch, tmp_path,
                                                                    name) -> None:
    _, options = served(monkeypatch, command(name, tmp_path))
    assert options["proxy_headers"] is False  # uvicorn then reads no X-Forwarded-For
    _, options = served(monkeypatch, [*command(name, tmp_path),
                                      "--forwarded-allow-ips", "10.0.0.2"])
    assert options["proxy_headers"] is True and options["forwarded_allow_ips"] == "10.0.0.2"
