"""Endpoint adapters: what differs between chat and completions, and nothing else.

The serve path (``serving.serve``) and the stream (``serving.streaming``) are
written once; an adapter builds the endpoint's own response, chunks and
usage chunk. Chat opens every choice with a role chunk and shows strategy
steps as ``reasoning_content``; completions have neither.

Example:
    >>> head = ResponseHead.new(CHAT, model="ssr@my-model")
    >>> CHAT.delta(head, 0, "Hello").model_dump(exclude_none=True)["choices"][0]["delta"]
    {'content': 'Hello'}
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import BaseModel

from refinery.engine.trace import Trace
from refinery.serving.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChunkChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionResponse,
    DeltaMessage,
    RefineryInfo,
    ResponseMessage,
    UsageInfo,
)
from refinery.serving.service import Outcome, Prepared, trace_summary


def new_id(prefix: str) -> str:
    """A response id: ``chatcmpl-<32 hex>``, ``cmpl-<32 hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponseHead:
    """What every chunk and the response of one request share: id, time, model."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, endpoint: Endpoint, model: str) -> ResponseHead:
        return cls(id=new_id(endpoint.id_prefix), created=int(time.time()), model=model)


def answer(trace: Trace) -> tuple[str, str]:
    """A choice's final text and finish reason."""
    if trace.attempt is None:
        return "", "stop"
    return trace.attempt.text, trace.attempt.finish_reason


def usage_info(outcome: Outcome) -> UsageInfo:
    u = outcome.usage
    return UsageInfo(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                     total_tokens=u.total_tokens)


def refinery_info(prep: Prepared, outcome: Outcome) -> RefineryInfo:
    """The ``refinery`` extension of a response: spec, calls, time, and the trace asked."""
    trace = None
    if prep.trace_mode == "summary":
        trace = [trace_summary(t) for t in outcome.traces]
    elif prep.trace_mode == "full":
        trace = [t.model_dump(mode="json") for t in outcome.traces]
    return RefineryInfo(strategy=prep.spec, calls=outcome.usage.calls,
                        seconds=round(outcome.seconds, 3), trace=trace)


class Endpoint:
    """The adapter interface; :data:`CHAT` and :data:`COMPLETION` implement it."""

    name: ClassVar[Literal["chat", "completion"]]
    id_prefix: ClassVar[str]

    def opening(self, head: ResponseHead, i: int) -> BaseModel | None:
        """The chunk that opens choice ``i`` of a stream, if the endpoint has one."""
        return None

    def reasoning(self, head: ResponseHead, i: int, text: str) -> BaseModel | None:
        """A strategy step of choice ``i`` as a chunk, if the endpoint shows steps."""
        return None

    def delta(self, head: ResponseHead, i: int, text: str) -> BaseModel:
        raise NotImplementedError

    def finish(self, head: ResponseHead, i: int, reason: str) -> BaseModel:
        raise NotImplementedError

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> BaseModel:
        raise NotImplementedError

    def response(self, head: ResponseHead, outcome: Outcome, info: RefineryInfo) -> BaseModel:
        raise NotImplementedError


class ChatEndpoint(Endpoint):
    """``/v1/chat/completions``."""

    name = "chat"
    id_prefix = "chatcmpl"

    def chunk(self, head: ResponseHead, i: int, delta: DeltaMessage,
              finish: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=head.id, created=head.created, model=head.model,
                                   choices=[ChunkChoice(index=i, delta=delta,
                                                        finish_reason=finish)])

    def opening(self, head: ResponseHead, i: int) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(role="assistant", content=""))

    def reasoning(self, head: ResponseHead, i: int, text: str) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(reasoning_content=text))

    def delta(self, head: ResponseHead, i: int, text: str) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(content=text))

    def finish(self, head: ResponseHead, i: int, reason: str) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(), reason)

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=head.id, created=head.created, model=head.model,
                                   choices=[], usage=usage, refinery=info)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> ChatCompletionResponse:
        choices = [ChatChoice(index=i, message=ResponseMessage(content=text),
                              finish_reason=reason)
                   for i, (text, reason) in enumerate(map(answer, outcome.traces))]
        return ChatCompletionResponse(id=head.id, created=head.created, model=head.model,
                                      choices=choices, usage=usage_info(outcome),
                                      refinery=info)


class CompletionEndpoint(Endpoint):
    """``/v1/completions``: text chunks, no role, no reasoning, no extension on chunks."""

    name = "completion"
    id_prefix = "cmpl"

    def chunk(self, head: ResponseHead, i: int, text: str,
              finish: str | None = None) -> CompletionChunk:
        return CompletionChunk(id=head.id, created=head.created, model=head.model,
                               choices=[CompletionChoice(index=i, text=text,
                                                         finish_reason=finish)])

    def delta(self, head: ResponseHead, i: int, text: str) -> CompletionChunk:
        return self.chunk(head, i, text)

    def finish(self, head: ResponseHead, i: int, reason: str) -> CompletionChunk:
        return self.chunk(head, i, "", reason)

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> CompletionChunk:
        return CompletionChunk(id=head.id, created=head.created, model=head.model,
                               choices=[], usage=usage)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> CompletionResponse:
        choices = [CompletionChoice(index=i, text=text, finish_reason=reason)
                   for i, (text, reason) in enumerate(map(answer, outcome.traces))]
        return CompletionResponse(id=head.id, created=head.created, model=head.model,
                                  choices=choices, usage=usage_info(outcome), refinery=info)


CHAT = ChatEndpoint()
COMPLETION = CompletionEndpoint()
