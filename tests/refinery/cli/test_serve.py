"""The ``refinery`` command line: options reach the objects they configure."""

from __future__ import annotations

import asyncio
import signal

import pytest
import uvicorn
from click.testing import CliRunner

from refinery import serving
from refinery.cli import app
from refinery.engine.backends.vllm import VLLMBackend


@pytest.mark.parametrize(("flags", "eager", "dtype"), [
    ([], True, "auto"), (["--compile"], False, "auto"), (["--dtype", "float32"], True, "float32"),
    (["--compile", "--dtype", "bfloat16"], False, "bfloat16")])
def test_serve_engine_flags_reach_the_vllm_engine_config(monkeypatch, flags, eager,
                                                         dtype) -> None:
    factories, configs = [], []
    real_create_app = serving.create_app

    def create_app(config, backend_factory):
        factories.append(backend_factory)
        return real_create_app(config, backend_factory=backend_factory)

    async def create(model, config=None):
        configs.append((model, config))
        return "backend"

    monkeypatch.setattr(serving, "create_app", create_app)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)  # no socket, no engine
    monkeypatch.setattr(VLLMBackend, "create", create)
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(app, ["serve", "--model", "m", *flags])
    finally:
        signal.signal(signal.SIGTERM, before)  # serve installs its own
    assert result.exit_code == 0, result.output
    assert asyncio.run(factories[0]()) == "backend"
    [(model, config)] = configs
    assert model == "m"
    assert config.enforce_eager is eager
    assert config.dtype == dtype


def test_serve_mounts_the_web_page_with_its_runs_and_keys(monkeypatch, tmp_path) -> None:
    apps = []
    real_create_app = serving.create_app

    def create_app(config, backend_factory):
        apps.append(real_create_app(config, backend_factory=backend_factory))
        return apps[-1]

    monkeypatch.setattr(serving, "create_app", create_app)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: None)
    monkeypatch.setenv("REFINERY_API_KEYS", "k1")
    before = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(app, ["serve", "--model", "m", "--runs", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert result.exit_code == 0, result.output
    settings = apps[0].state.ui
    assert (settings.runs, settings.model, settings.api_keys) == (tmp_path, "m",
                                                                  frozenset({"k1"}))
    assert "/ui" in {getattr(r, "path", None) for r in apps[0].routes}


def test_ui_serves_a_runs_directory_without_an_engine(monkeypatch, tmp_path) -> None:
    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: served.append((app_, kw)))
    monkeypatch.delenv("REFINERY_API_KEYS", raising=False)
    result = CliRunner().invoke(app, ["ui", "--runs", str(tmp_path), "--port", "9123"])
    assert result.exit_code == 0, result.output
    [(ui_app, kw)] = served
    assert ui_app.state.ui.runs == tmp_path and ui_app.state.ui.model is None
    assert kw["port"] == 9123 and kw["host"] == "127.0.0.1"
    missing = CliRunner().invoke(app, ["ui", "--runs", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no directory" in missing.output
