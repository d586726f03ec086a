"""Server-sent events: the one generator pattern every stream uses.

``sse(chunks)`` turns an async iterator of pydantic chunks (or raw ``:``
comment strings, used as keep-alives) into ``data: {json}\\n\\n`` events. If
the iterator fails after the stream began, an error chunk in the OpenAI error
schema is sent; ``data: [DONE]`` always ends the stream.

``chat_chunks`` streams a strategy run: the role chunk first for every choice,
intermediate strategy steps as ``delta.reasoning_content``, the final answer as
``delta.content`` (token by token when the final stage is a generation),
``finish_reason`` on each choice's last chunk, and the usage chunk.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from refinery.engine.errors import RefineryError
from refinery.engine.trace import TraceEvent
from refinery.serving.protocol import (
    ChatCompletionChunk,
    ChunkChoice,
    CompletionChoice,
    CompletionChunk,
    DeltaMessage,
    RefineryInfo,
    UsageInfo,
)
from refinery.serving.service import Outcome, Prepared, Service

log = logging.getLogger(__name__)
REASONING_CHARS = 2000


async def sse(chunks: AsyncIterator[BaseModel | str]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            if isinstance(chunk, str):
                yield chunk
            else:
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
    except RefineryError as exc:
        yield f"data: {json.dumps(exc.to_openai())}\n\n"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the client is gone: nobody to send [DONE] to
        # A cancellation from inside the run (an engine aborting a request), not
        # of this response: the client is still there and must see the stream end.
        log.error("stream cancelled from inside the run")
        body = {"error": {"message": "the request was cancelled inside the engine",
                          "type": "server_error", "param": None, "code": None}}
        yield f"data: {json.dumps(body)}\n\n"
    except Exception as exc:  # the stream has begun: an error chunk is all we can send
        log.exception("stream failed")
        body = {"error": {"message": f"internal error: {type(exc).__name__}",
                          "type": "internal_error", "param": None, "code": None}}
        yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


def reasoning_text(ev: TraceEvent) -> str | None:
    """How a strategy step reads in a thinking pane (None: not shown)."""
    if ev.data.get("final"):
        return None  # already streamed as content
    if ev.kind == "generation":
        comps = ev.completions or []
        if not comps:
            return None
        body = comps[0].text
        if len(comps) > 1:
            body = f"({len(comps)} samples) {body}"
    else:
        body = ev.text or json.dumps(ev.data, default=str)
    body = body if len(body) <= REASONING_CHARS else body[:REASONING_CHARS] + " …"
    return f"[{ev.strategy or 'strategy'} · {ev.step}] {body}\n\n"


async def events_of_run(service: Service, prep: Prepared,
                        keepalive: float) -> AsyncIterator[tuple[str, int, Any]]:
    """Run a request; yield (kind, choice, payload): reasoning, content, done, keepalive."""
    queue: asyncio.Queue = asyncio.Queue()

    def listener(i: int, ev: TraceEvent) -> None:
        text = reasoning_text(ev)
        if text:
            queue.put_nowait(("reasoning", i, text))

    def sink(i: int):
        async def put(text: str) -> None:
            queue.put_nowait(("content", i, text))
        return put

    async def work() -> None:
        try:
            queue.put_nowait(("done", -1, await service.run(prep, listener, sink)))
        except BaseException as exc:
            queue.put_nowait(("error", -1, exc))
            raise

    task = asyncio.ensure_future(work())
    try:
        while True:
            try:
                kind, i, payload = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                yield ("keepalive", -1, None)
                continue
            if kind == "error":
                raise payload
            yield (kind, i, payload)
            if kind == "done":
                return
    finally:
        # Client gone or failure: cancelling the run aborts its backend requests.
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def usage_info(outcome: Outcome) -> UsageInfo:
    u = outcome.usage
    return UsageInfo(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                     total_tokens=u.total_tokens)


async def chat_chunks(service: Service, prep: Prepared, *, rid: str, created: int,
                      model: str, include_usage: bool,
                      info: Any) -> AsyncIterator[BaseModel | str]:
    def chunk(i: int, delta: DeltaMessage, finish: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=rid, created=created, model=model, choices=[
            ChunkChoice(index=i, delta=delta, finish_reason=finish)])

    for i in range(prep.n):
        yield chunk(i, DeltaMessage(role="assistant", content=""))
    streamed = [False] * prep.n
    async for kind, i, payload in events_of_run(service, prep, service.config.keepalive_seconds):
        if kind == "keepalive":
            yield ": keep-alive\n\n"
        elif kind == "reasoning":
            yield chunk(i, DeltaMessage(reasoning_content=payload))
        elif kind == "content":
            streamed[i] = True
            yield chunk(i, DeltaMessage(content=payload))
        elif kind == "done":
            outcome: Outcome = payload
            for j, trace in enumerate(outcome.traces):
                att = trace.attempt
                if not streamed[j] and att is not None and att.text:
                    yield chunk(j, DeltaMessage(content=att.text))
                yield chunk(j, DeltaMessage(), att.finish_reason if att else "stop")
            ext = info(outcome)
            if include_usage:
                yield ChatCompletionChunk(id=rid, created=created, model=model, choices=[],
                                          usage=usage_info(outcome), refinery=ext)


async def completion_chunks(service: Service, prep: Prepared, *, rid: str, created: int,
                            model: str, include_usage: bool) -> AsyncIterator[BaseModel | str]:
    def chunk(i: int, text: str, finish: str | None = None) -> CompletionChunk:
        return CompletionChunk(id=rid, created=created, model=model, choices=[
            CompletionChoice(index=i, text=text, finish_reason=finish)])

    streamed = [False] * prep.n
    async for kind, i, payload in events_of_run(service, prep, service.config.keepalive_seconds):
        if kind == "keepalive":
            yield ": keep-alive\n\n"
        elif kind == "content":
            streamed[i] = True
            yield chunk(i, payload)
        elif kind == "done":
            outcome: Outcome = payload
            for j, trace in enumerate(outcome.traces):
                att = trace.attempt
                if not streamed[j] and att is not None and att.text:
                    yield chunk(j, att.text)
                yield chunk(j, "", att.finish_reason if att else "stop")
            if include_usage:
                yield CompletionChunk(id=rid, created=created, model=model, choices=[],
                                      usage=usage_info(outcome))


__all__ = ["RefineryInfo", "chat_chunks", "completion_chunks", "sse"]
