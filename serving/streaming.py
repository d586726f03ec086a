"""Server-sent events: the one generator pattern every stream uses.

``sse(chunks)`` turns an async iterator of pydantic chunks (or raw ``:``
comment strings, used as keep-alives) into ``data: {json}\\n\\n`` events. If
the iterator fails after the stream began, an error chunk in the OpenAI error
schema is sent; ``data: [DONE]`` always ends the stream.

``stream_chunks`` streams a strategy run through an endpoint adapter: each
choice's opening chunk first (chat: the role), intermediate strategy steps as
reasoning (chat: ``delta.reasoning`` and ``delta.reasoning_content``), the final
answer as it is generated (token by token when the final stage is a generation,
with its tokens' logprobs when asked; the model's own thinking in it as
reasoning, or whole before the answer when the answer was not streamed),
``finish_reason`` on each choice's last chunk, then the usage chunk. Under a
strategy with a response format, the strategy's generations are steps
(reasoning) and the constrained call that shapes the answer streams as content
(or as a named tool call's argument deltas).

Example:
    >>> async for event in sse(stream_chunks(CHAT, head, prep, service)):  # doctest: +SKIP
    ...     print(event, end="")
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from refinery.engine.context import DeltaSink
from refinery.engine.errors import RefineryError
from refinery.engine.tool_calls import OPEN, CallDelta
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Completion, Delta, TokenLogprob
from refinery.serving.endpoints import (
    Endpoint,
    OnError,
    ResponseHead,
    answer,
    new_call_id,
    refinery_info,
    usage_info,
)
from refinery.serving.errors import openai_error
from refinery.serving.service import Outcome, Prepared, Service
from refinery.serving.structured import Reply

log = logging.getLogger(__name__)
REASONING_CHARS = 2000
KEEPALIVE = ": keep-alive\n\n"
DONE = "data: [DONE]\n\n"
CANCELLED_INSIDE = {"error": {"message": "the request was cancelled inside the engine",
                              "type": "server_error", "param": None, "code": None}}


async def sse(chunks: AsyncIterator[BaseModel | str],
              on_error: OnError | None = None) -> AsyncIterator[str]:
    """``chunks`` as SSE events: an error chunk if they fail (or the events
    ``on_error`` gives for the failure), ``[DONE]`` always last."""
    try:
        async for chunk in chunks:
            if isinstance(chunk, str):
                yield chunk
            else:
                yield f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # the client is gone: nobody to send [DONE] to
        # A cancellation from inside the run (an engine aborting a request), not
        # of this response: the client is still there and must see the stream end.
        log.error("stream cancelled from inside the run")
        yield f"data: {json.dumps(CANCELLED_INSIDE)}\n\n"
    except Exception as exc:  # the stream has begun: an error chunk is all we can send
        if not isinstance(exc, RefineryError):
            log.exception("stream failed")
        if on_error is not None:
            for event in on_error(exc):
                yield event
        else:
            yield f"data: {openai_error(exc)[1].model_dump_json()}\n\n"
    yield DONE


def reasoning_text(ev: TraceEvent) -> str | None:
    """How a strategy step reads in a thinking pane (None: not shown)."""
    if ev.data.get("final"):
        return None  # already streamed as content
    note = ""
    if ev.kind == "generation":
        comps = ev.completions or []
        if not comps:
            return None
        body = comps[0].text
        if len(comps) > 1:
            body = f"({len(comps)} samples) {body}"
        note = confidence_note(comps)
    else:
        body = ev.text or json.dumps(ev.data, default=str)
    body = body if len(body) <= REASONING_CHARS else body[:REASONING_CHARS] + " …"
    return f"[{ev.strategy or 'strategy'} · {ev.step}] {note}{body}\n\n"


def confidence_note(comps: list[Completion]) -> str:
    """The samples' confidences and stops, when a confidence rule measured them (deepconf).

    Example:
        >>> def sample(tokens, **measures):
        ...     return Completion(text="", prompt_tokens=9, completion_tokens=tokens,
        ...                       finish_reason="stop", measures=measures)
        >>> confidence_note([sample(90, confidence=9.123), sample(64, confidence=7.4,
        ...                                                       stopped_at=64)])
        '(confidence 9.12, 7.40 stopped at token 64) '
        >>> confidence_note([sample(90)])
        ''
    """
    parts = [f"{m['confidence']:.2f}" + (f" stopped at token {m['stopped_at']}"
                                         if m.get("stopped_at") is not None else "")
             for c in comps if (m := c.measures or {}).get("confidence") is not None]
    return f"(confidence {', '.join(parts)}) " if parts else ""


@dataclass(frozen=True)
class RunEvent:
    """What a running request reports: a step, the model's thinking, answer text, a
    piece of a native tool call, its end, or a keep-alive."""

    kind: Literal["reasoning", "thinking", "content", "call", "done", "keepalive"]
    choice: int = -1
    text: str = ""
    outcome: Outcome | None = None
    logprobs: list[TokenLogprob] | None = None  # of a content event's tokens
    call: CallDelta | None = None  # a piece of a native tool call


async def events_of_run(service: Service, prep: Prepared,
                        keepalive: float) -> AsyncIterator[RunEvent]:
    """Run a request in a task; yield its events as they come (keep-alives when idle).

    Raises:
        Whatever the run raised; leaving early cancels the run (and its backend requests).
    """
    queue: asyncio.Queue[RunEvent | BaseException] = asyncio.Queue()

    def listener(i: int, ev: TraceEvent) -> None:
        text = reasoning_text(ev)
        if text:
            queue.put_nowait(RunEvent("reasoning", i, text))

    def sink(i: int) -> DeltaSink:
        async def put(delta: Delta) -> None:
            if delta.reasoning:
                queue.put_nowait(RunEvent("thinking", i, delta.reasoning))
            queue.put_nowait(RunEvent("content", i, delta.text, logprobs=delta.logprobs))
            for piece in delta.tool_calls or []:
                queue.put_nowait(RunEvent("call", i, call=piece))
        return put

    async def work() -> None:
        try:
            queue.put_nowait(RunEvent("done", outcome=await service.run(prep, listener, sink)))
        except BaseException as exc:
            queue.put_nowait(exc)
            raise

    task = asyncio.ensure_future(work())
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), keepalive)
            except TimeoutError:
                event = RunEvent("keepalive")
            if isinstance(event, BaseException):
                raise event
            yield event
            if event.kind == "done":
                return
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class Sent:
    """What a stream has sent of one choice's answer: characters, logprobs held back,
    and, while an ``"auto"`` tool turn has not shown yet whether it answers in text
    or opens a call, the text held back (``pending``)."""

    chars: int = 0
    held: list[TokenLogprob] = field(default_factory=list)
    pending: str | None = None
    thought: bool = False  # some of the model's thinking was streamed
    call_ids: dict[int, str] = field(default_factory=dict)  # native calls streamed, by index

    def call_id(self, piece: CallDelta) -> str | None:
        """A new call's id on its first piece (None on the pieces after it)."""
        if piece.index in self.call_ids:
            return None
        self.call_ids[piece.index] = new_call_id()
        return self.call_ids[piece.index]

    def undecided(self, reply: Reply, text: str) -> str | None:
        """``text`` to stream now, or None while the answer may still be a tool call."""
        if reply.tools != "auto" or self.pending == "":
            return text
        self.pending = (self.pending or "") + text
        body = self.pending.lstrip()
        if body.startswith(OPEN) or OPEN.startswith(body):  # a call, or not known yet
            return None
        text, self.pending = self.pending, ""  # text: what was held, then the rest as it comes
        return text


def content_chunk(endpoint: Endpoint, head: ResponseHead, ev: RunEvent,
                  sent: Sent) -> BaseModel | None:
    """A piece of the answer as a chunk (None: nothing to send yet).

    A token with no text of its own yet (part of a character) holds its
    logprobs back for the next piece, so every chunk has text and a tool
    call's first chunk is the one that names it.
    """
    if head.reply.logprobs and ev.logprobs:
        sent.held += ev.logprobs
    if not ev.text or (text := sent.undecided(head.reply, ev.text)) is None:
        return None
    logprobs, sent.held = (sent.held if head.reply.logprobs else None), []
    chunk = endpoint.delta(head, ev.choice, text, logprobs, sent.chars)
    sent.chars += len(text)
    return chunk


def event_chunk(endpoint: Endpoint, head: ResponseHead, ev: RunEvent,
                sent: Sent) -> BaseModel | None:
    """A step, a piece of thinking, answer text or a call piece as a chunk (None: none)."""
    if ev.kind == "reasoning":
        return endpoint.reasoning(head, ev.choice, ev.text)
    if ev.kind == "thinking":
        sent.thought = True
        return endpoint.thinking(head, ev.choice, ev.text)
    if ev.kind == "content":
        return content_chunk(endpoint, head, ev, sent)
    if ev.kind == "call" and ev.call is not None:
        return endpoint.call_delta(head, ev.choice, ev.call, sent.call_id(ev.call))
    return None


def closing_chunks(endpoint: Endpoint, head: ResponseHead, i: int, trace: Trace,
                   sent: Sent) -> Iterator[BaseModel]:
    """Choice ``i``'s last chunks: its thinking if it was not streamed, then the
    endpoint's closing (text or calls not streamed yet, the finish)."""
    ans = answer(trace, head.reply.logprobs)
    if ans.thinking and not sent.thought:  # an answer that was not streamed
        if (chunk := endpoint.thinking(head, i, ans.thinking)) is not None:
            yield chunk
    yield from endpoint.closing(head, i, ans, sent.chars, bool(sent.call_ids))


async def stream_chunks(endpoint: Endpoint, head: ResponseHead, prep: Prepared,
                        service: Service, *,
                        include_usage: bool = False) -> AsyncIterator[BaseModel | str]:
    """One request's chunks, in the endpoint's shapes (see the module docstring)."""
    for i in range(prep.n):
        if (opening := endpoint.opening(head, i)) is not None:
            yield opening
    sent = [Sent() for _ in range(prep.n)]
    async for ev in events_of_run(service, prep, service.config.keepalive_seconds):
        if ev.kind == "keepalive":
            yield KEEPALIVE
        elif ev.outcome is not None:
            for i, trace in enumerate(ev.outcome.traces):
                for chunk in closing_chunks(endpoint, head, i, trace, sent[i]):
                    yield chunk
            if include_usage:
                yield endpoint.usage_chunk(head, usage_info(ev.outcome),
                                           refinery_info(prep, ev.outcome))
        elif (chunk := event_chunk(endpoint, head, ev, sent[ev.choice])) is not None:
            yield chunk
