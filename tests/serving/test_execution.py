"""Execution strategies served: ``pot@MODEL`` and ``tir@MODEL`` stream each program
and what it printed as ``reasoning_content``; the answer is the content. OptiLLM's
``executecode`` runs tir, and an upstream that cannot continue a turn is a 400."""

from __future__ import annotations

import pytest

from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import CHAT, ERROR_KEYS, MODEL, chat, sse_data
from tests.strategies.test_tir import ANSWER, BLOCK, reply_by_runs

pytestmark = pytest.mark.timeout(60)

POT_PROGRAM = "```python\ndef solution():\n    return (3 + 4) * 2\n```"


async def streamed(client, url: str, model: str) -> tuple[str, str]:
    r = await client.post(url + CHAT, json=chat(model=model, stream=True))
    assert r.status_code == 200, r.text
    chunks = sse_data(r.text)
    assert chunks[-1] == "[DONE]"
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1] if c["choices"]]
    assert deltas[0].get("role") == "assistant"
    return ("".join(d.get("reasoning_content") or "" for d in deltas),
            "".join(d.get("content") or "" for d in deltas))


async def test_tir_streams_its_code_and_output_as_reasoning(scripted_serve, client):
    backend = ScriptedBackend([(r".*", reply_by_runs(BLOCK, ANSWER))])
    url, _ = await scripted_serve(backend=backend)
    reasoning, content = await streamed(client, url, f"tir@{MODEL}")
    assert "print((3 + 4) * 2)" in reasoning and "```output\n14\n```" in reasoning
    assert "\\boxed{14}" in content
    optillm, _ = await streamed(client, url, f"executecode-{MODEL}")
    assert "```output\n14\n```" in optillm


async def test_pot_streams_the_program_and_its_run(scripted_serve, client):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", POT_PROGRAM)]))
    reasoning, content = await streamed(client, url, f"pot@{MODEL}")
    assert "return (3 + 4) * 2" in reasoning and "output: 14" in reasoning
    assert "\\boxed{14}" in content


async def test_tir_on_a_backend_that_cannot_continue_is_a_400(scripted_serve, client):
    backend = ScriptedBackend([(r".*", BLOCK)], continues_messages=False)
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(model=f"tir@{MODEL}"))
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == ERROR_KEYS and error["code"] == "continuation_unsupported"
    assert backend.calls == []


async def test_the_execution_and_search_presets_are_listed(scripted_serve, client):
    url, _ = await scripted_serve()
    listed = {m["id"] for m in (await client.get(url + "/v1/models")).json()["data"]}
    for preset in ("pot", "sc_pot", "tir", "beam", "dvts", "particle"):
        assert f"{preset}@{MODEL}" in listed
