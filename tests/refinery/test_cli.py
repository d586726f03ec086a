"""The ``refinery`` command line: options reach the objects they configure."""

from __future__ import annotations

import asyncio
import signal

import pytest
import uvicorn
from typer.testing import CliRunner

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
