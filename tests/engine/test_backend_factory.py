"""One backend factory for every command (its exit statuses: tests/refinery/cli/test_console.py)."""

from __future__ import annotations

import pytest

from refinery.engine.backends.factory import BackendKind, BackendSpec, make_backend
from refinery.engine.backends.openai import OpenAIBackend
from refinery.engine.backends.vllm import VLLMBackend
from refinery.engine.errors import InvalidRequestError


async def test_vllm_spec_reaches_the_engine_config(monkeypatch) -> None:
    seen = []

    async def create(model, config=None):
        seen.append((model, config))
        return "engine"

    monkeypatch.setattr(VLLMBackend, "create", create)
    assert await make_backend(BackendSpec("m", dtype="float32", compile_graph=True)) == "engine"
    [(model, config)] = seen
    assert (model, config.dtype, config.enforce_eager) == ("m", "float32", False)


async def test_openai_spec_builds_the_upstream_adapter(monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    be = await make_backend(BackendSpec("m", BackendKind.openai, ("http://127.0.0.1:9/v1",),
                                        max_concurrency=3))
    try:
        assert isinstance(be, OpenAIBackend) and be.model == "m"
        assert be.structured_outputs == {"json", "json_object"}
    finally:
        await be.aclose()
    with pytest.raises(InvalidRequestError, match="--base-url"):
        await make_backend(BackendSpec("m", BackendKind.openai))


async def test_a_vllm_server_upstream_takes_every_constraint_kind() -> None:
    be = await make_backend(BackendSpec("m", BackendKind("vllm-server"),
                                        ("http://127.0.0.1:9/v1",)))
    try:
        assert isinstance(be, OpenAIBackend)
        assert be.structured_outputs == {"json", "json_object", "regex", "choice", "grammar",
                                         "structural_tag"}
    finally:
        await be.aclose()
