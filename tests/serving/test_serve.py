"""The one serve path over HTTP: stream framing for both endpoints, the error chunk,
client disconnects aborting the backend's work, and the engine death policy."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from refinery.engine.errors import BackendError
from refinery.serving import ServerConfig
from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    COMPLETIONS,
    MODEL,
    chat,
    scripted,
    sse_data,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run


def broken(messages, params, i) -> str:
    raise BackendError("upstream broke mid-answer")


async def test_chat_stream_role_first_content_finish_usage_done(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(n=2, stream=True,
                                                stream_options={"include_usage": True}))
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    events = sse_data(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = events[:-1]
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""}] * 2
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(ch["delta"].get("content", "") for ch in mine) == ANSWER
        assert [ch.get("finish_reason") for ch in mine][-1] == "stop"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 18
    assert usage["refinery"]["calls"] == 2


async def test_completion_stream_has_no_role_and_ends_with_done(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                                   "stream": True})
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == ANSWER
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_strategy_steps_stream_as_reasoning_then_answer(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(model=f"sc(cot, n=2)@{MODEL}", stream=True))
    deltas = [c["choices"][0]["delta"] for c in sse_data(r.text)[:-1] if c["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert "[cot" in reasoning and ANSWER in reasoning
    assert "".join(d.get("content", "") for d in deltas).strip()


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_a_failing_run_sends_the_error_chunk_then_done(scripted_serve, client, path):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", broken)]))
    body = chat(stream=True) if path == CHAT else {"model": MODEL, "prompt": "hi",
                                                   "stream": True}
    r = await client.post(url + path, json=body)
    assert r.status_code == 200  # the stream had begun
    events = sse_data(r.text)
    assert events[-1] == "[DONE]"
    assert events[-2] == {"error": {"message": "upstream broke mid-answer",
                                    "type": "backend_error", "param": None, "code": None}}
    if path == CHAT:
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"


async def test_a_failing_run_without_stream_is_the_error_status(scripted_serve, client):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", broken)]))
    r = await client.post(url + CHAT, json=chat())
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "backend_error"


async def test_client_leaving_a_stream_cancels_the_backend_call(scripted_serve):
    backend = scripted(hang_after=0)
    url, app = await scripted_serve(backend=backend)
    async with httpx.AsyncClient(timeout=20) as http:
        async with http.stream("POST", url + CHAT, json=chat(stream=True)) as stream:
            lines = stream.aiter_lines()
            assert "assistant" in await anext(lines)
            assert await wait_for(lambda: backend.in_flight == 1)
            await lines.aclose()
    # The server notices at its next write (keep-alive every 10 s) or receive;
    # either way the backend's call must end as cancelled, not finish.
    assert await wait_for(lambda: backend.cancelled == [0], seconds=15)
    assert await wait_for(lambda: app.state.server.capacity.in_flight == 0)


async def test_client_leaving_a_whole_response_cancels_the_backend_call(scripted_serve):
    backend = scripted(hang_after=0)
    url, app = await scripted_serve(backend=backend)
    async with httpx.AsyncClient(timeout=20) as http:
        request = asyncio.ensure_future(http.post(url + CHAT, json=chat()))
        assert await wait_for(lambda: backend.in_flight == 1)
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
    assert await wait_for(lambda: backend.cancelled == [0])
    assert backend.log == [("start", 0), ("cancel", 0)]
    assert await wait_for(lambda: app.state.server.capacity.in_flight == 0)


# -- engine supervision ----------------------------------------------------------------

async def test_engine_death_with_exit_policy_stops_the_server(scripted_serve, client):
    backend = scripted()

    async def factory():
        return backend

    stopped = []
    config = ServerConfig(on_engine_death="exit", engine_check_seconds=0.02)
    url, app = await scripted_serve(config, backend_factory=factory)
    app.state.stop_server = lambda: stopped.append(True)
    assert await wait_for(lambda: app.state.server.service.ready)
    assert (await client.get(url + "/health")).status_code == 200
    backend.die()
    assert await wait_for(lambda: stopped == [True])
    assert app.state.engine_died is True


async def test_engine_death_with_restart_policy_builds_a_new_backend(scripted_serve, client):
    built: list[ScriptedBackend] = []

    async def factory():
        built.append(scripted())
        return built[-1]

    config = ServerConfig(on_engine_death="restart", max_engine_restarts=1,
                          engine_check_seconds=0.02)
    url, app = await scripted_serve(config, backend_factory=factory)
    assert await wait_for(lambda: len(built) == 1 and app.state.server.service.ready)
    built[0].die()
    assert await wait_for(lambda: len(built) == 2 and app.state.server.service.ready)
    assert built[0].closed and app.state.server.service.backend is built[1]
    r = await client.post(url + CHAT, json=chat())
    assert r.json()["choices"][0]["message"]["content"] == ANSWER
    stopped = []
    app.state.stop_server = lambda: stopped.append(True)
    built[1].die()  # the one restart is spent: now the server stops
    assert await wait_for(lambda: stopped == [True]) and app.state.engine_died
    assert len(built) == 2
