"""OpenAIBackend against vLLM's own OpenAI server and against fault servers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from engine.backends.openai import OpenAIBackend
from engine.errors import BackendUnavailableError, UnknownModelError
from engine.types import Message, SamplingParams
from tests.conftest import free_port

Q = [Message(role="user", content="What is 2+2? Answer briefly.")]


def ok_body(text: str = "4") -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


class FaultServer:
    """Answers ``failures`` errors (cycling through ``statuses``), then succeeds."""

    def __init__(self, failures: int, statuses=(429, 503)):
        self.failures, self.statuses, self.hits = failures, statuses, []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat():
            self.hits.append(time.monotonic())
            i = len(self.hits) - 1
            if i < self.failures:
                status = self.statuses[i % len(self.statuses)]
                return JSONResponse({"error": {"message": "busy", "type": "x"}},
                                    status_code=status)
            return ok_body()

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(5)


async def test_retries_429_and_503_then_succeeds():
    fault = FaultServer(failures=3)
    with fault as url:
        be = OpenAIBackend("m", url, backoff_initial=0.05, backoff_max=0.2)
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
        await be.aclose()
    assert c.text == "4" and c.prompt_tokens == 5
    assert len(fault.hits) == 4  # three refusals, then the success
    gaps = [b - a for a, b in zip(fault.hits, fault.hits[1:], strict=False)]
    assert all(g >= 0.02 for g in gaps)  # backed off, not hammered


async def test_always_failing_server_gives_clear_error_after_budget():
    fault = FaultServer(failures=10**6, statuses=(503,))
    with fault as url:
        be = OpenAIBackend("m", url, max_retries=3, backoff_initial=0.01, backoff_max=0.05)
        with pytest.raises(BackendUnavailableError, match="503 after retries"):
            await asyncio.wait_for(be.generate(Q, SamplingParams(max_tokens=4)), 30)
        await be.aclose()
    assert len(fault.hits) == 4  # 1 try + 3 retries, then it stops


async def test_unreachable_server_is_a_clear_error():
    be = OpenAIBackend("m", f"http://127.0.0.1:{free_port()}/v1", max_retries=1,
                       backoff_initial=0.01)
    with pytest.raises(BackendUnavailableError, match="unreachable"):
        await be.generate(Q, SamplingParams(max_tokens=4))
    await be.aclose()


@pytest.mark.e2e
async def test_against_vllm_openai_server(vllm_server):
    be = OpenAIBackend("smollm2-135m", vllm_server)
    [c] = await be.generate(Q, SamplingParams(temperature=0, max_tokens=24))
    assert "4" in c.text and c.prompt_tokens > 0 and c.completion_tokens > 0
    outs = await be.generate(Q, SamplingParams(temperature=1.0, max_tokens=16), n=3)
    assert len(outs) == 3
    pieces, final = [], None
    async for d in be.stream(Q, SamplingParams(temperature=0, max_tokens=24)):
        pieces.append(d.text)
        final = d.completion or final
    assert "".join(pieces) == final.text == c.text
    assert final.completion_tokens == c.completion_tokens
    many = await asyncio.gather(*(be.generate(Q, SamplingParams(max_tokens=8))
                                  for _ in range(8)))
    assert all(m[0].completion_tokens > 0 for m in many)
    with pytest.raises(UnknownModelError):
        await OpenAIBackend("nope", vllm_server, max_retries=0).generate(
            Q, SamplingParams(max_tokens=4))
    await be.aclose()
