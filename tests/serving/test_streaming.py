"""The SSE generator always ends a stream the client still reads with [DONE]."""

from __future__ import annotations

import asyncio
import json

from refinery.engine.errors import BudgetExhausted
from refinery.serving.streaming import sse


async def _collect(chunks) -> list[str]:
    return [event async for event in sse(chunks)]


async def test_error_after_start_gives_error_chunk_then_done():
    async def chunks():
        yield "data: {}\n\n"
        raise BudgetExhausted("token budget of 5 spent")

    events = await _collect(chunks())
    assert events[-1] == "data: [DONE]\n\n"
    body = json.loads(events[-2][len("data: "):])
    assert body["error"]["message"] == "token budget of 5 spent"


async def test_cancellation_from_inside_the_run_still_ends_with_done():
    async def chunks():
        yield "data: {}\n\n"
        raise asyncio.CancelledError  # e.g. the engine aborted the request

    events = await _collect(chunks())
    assert events[-1] == "data: [DONE]\n\n"
    assert json.loads(events[-2][len("data: "):])["error"]["type"] == "server_error"


async def test_cancellation_of_the_response_propagates():
    started = asyncio.Event()

    async def chunks():
        yield "data: {}\n\n"
        started.set()
        await asyncio.sleep(3600)
        yield "never"

    seen: list[str] = []

    async def consume() -> None:
        async for event in sse(chunks()):
            seen.append(event)

    task = asyncio.ensure_future(consume())
    await started.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert seen == ["data: {}\n\n"]
