"""The one serve path of chat and completions, parametrised by an endpoint adapter.

``serve`` validates the request (``Service.prepare``), then answers it whole
(``respond``: the run is cancelled if the client goes away) or as a stream
(``stream``: ``sse`` over ``stream_chunks``). Every request is counted in the
metrics once, when it ends. Capacity and auth are the routes' dependencies.

Example:
    >>> response = await serve(request, chat_request, CHAT, state)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from refinery.engine.errors import RefineryError
from refinery.serving.endpoints import Endpoint, ResponseHead, refinery_info
from refinery.serving.protocol import ChatCompletionRequest, CompletionRequest
from refinery.serving.service import Outcome, Prepared
from refinery.serving.state import ServerState
from refinery.serving.streaming import sse, stream_chunks

OpenAIRequest = ChatCompletionRequest | CompletionRequest
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DISCONNECT_POLL_SECONDS = 0.5


@dataclass
class Call:
    """One request being served: its endpoint, its prepared run, its response head."""

    endpoint: Endpoint
    prep: Prepared
    head: ResponseHead
    state: ServerState
    started: float = field(default_factory=time.monotonic)

    def observe(self, status: str, outcome: Outcome | None = None) -> None:
        self.state.metrics.observe(model=self.state.config.model, spec=self.prep.spec,
                                   endpoint=self.endpoint.name, status=status,
                                   seconds=time.monotonic() - self.started, outcome=outcome)


async def serve(request: Request, req: OpenAIRequest, endpoint: Endpoint,
                state: ServerState) -> Response:
    """Answer ``req`` on ``endpoint``, whole or streamed as the request asks."""
    # The response id names the task too: its trace, and the upstream its calls go to
    # (their affinity), so different requests spread over an upstream pool.
    rid = endpoint.new_id()
    prep = state.service.prepare(req, task_id=rid)
    call = Call(endpoint, prep, ResponseHead.new(endpoint, req.model, prep.reply, rid), state)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(stream(call, include_usage), media_type="text/event-stream",
                                 headers=STREAM_HEADERS)
    return await respond(request, call)


async def respond(request: Request, call: Call) -> JSONResponse:
    """Run the request to its end and answer the whole response."""
    try:
        outcome = await run_or_disconnect(request, call.state.service.run(call.prep))
    except RefineryError as exc:
        call.observe(str(exc.status))
        raise
    call.observe("200", outcome)
    body = call.endpoint.response(call.head, outcome, refinery_info(call.prep, outcome))
    return JSONResponse(body.model_dump(mode="json", exclude_none=True))


async def stream(call: Call, include_usage: bool) -> AsyncIterator[str]:
    """The SSE events of the request; counted as ``aborted`` if the client leaves."""
    status = "ok"
    chunks = stream_chunks(call.endpoint, call.head, call.prep, call.state.service,
                           include_usage=include_usage)
    events, on_error = call.endpoint.streamed(call.head, chunks)
    try:
        async for event in sse(events, on_error):
            yield event
    except BaseException:
        status = "aborted"
        raise
    finally:
        call.observe(status)


async def run_or_disconnect(request: Request, run: Awaitable[Outcome]) -> Outcome:
    """Await ``run``; if the client goes away first, cancel it (aborting backend work)."""
    work = asyncio.ensure_future(run)
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_SECONDS)
            if not work.done() and await request.is_disconnected():
                work.cancel()
                break
        return await work
    finally:
        work.cancel()
