"""A chat stream as the Responses API's event sequence.

``ResponsesStream.events`` reads the chat chunks of one request (role, reasoning,
content or tool-call deltas, the finish, the usage chunk) and writes OpenAI's
events, each ``event: <type>`` and ``data: {json}`` with a ``sequence_number``:

    response.created, response.in_progress
    [reasoning]  output_item.added, the model's thinking as reasoning_text.delta...,
                 then per step: reasoning_summary_part.added,
                 reasoning_summary_text.delta, reasoning_summary_text.done,
                 reasoning_summary_part.done; reasoning_text.done (if it thought);
                 output_item.done
    [message]    output_item.added, content_part.added, output_text.delta...,
                 output_text.done, content_part.done, output_item.done
    [call]       output_item.added, function_call_arguments.delta...,
                 function_call_arguments.done, output_item.done
    response.completed (or response.incomplete at max_output_tokens)

The finished response (the one ``response.completed`` carries) is handed to
``on_done`` before that event is sent: a client that reads the event and
continues the response at once finds it stored.

On a failure after the stream began, ``failed`` gives an ``error`` event and
``response.failed``; ``sse`` ends every stream with ``data: [DONE]``, which the
official client reads as the end.

Example:
    >>> stream = ResponsesStream(endpoint.shell, head)  # doctest: +SKIP
    >>> async for event in sse(stream.events(chunks), stream.failed):  # doctest: +SKIP
    ...     print(event, end="")  # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel

from refinery.serving.endpoints import ResponseHead
from refinery.serving.errors import openai_error
from refinery.serving.protocol import ChatCompletionChunk, DeltaToolCall, UsageInfo
from refinery.serving.responses_protocol import (
    FunctionCallItem,
    IncompleteDetails,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseEvent,
    ResponseObject,
    ResponseUsage,
    SummaryText,
)

__all__ = ["ResponsesStream", "Thinking", "finished", "item_id", "usage"]

# The response object with the request's fields echoed (ResponsesEndpoint.shell).
Shell = Callable[..., ResponseObject]


def item_id(prefix: str) -> str:
    """An output item id: ``msg_<32 hex>``, ``rs_...``, ``fc_...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


def finished(reason: str | None) -> dict:
    """The response's status for the answer's finish reason."""
    if reason == "length":
        return {"status": "incomplete",
                "incomplete_details": IncompleteDetails(reason="max_output_tokens")}
    return {"status": "completed"}


def usage(u: UsageInfo) -> ResponseUsage:
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else None
    return ResponseUsage.model_validate({
        "input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens, "input_tokens_details": {"cached_tokens": cached or 0},
        "output_tokens_details": {
            "reasoning_tokens": u.completion_tokens_details.reasoning_tokens}})




class Thinking(BaseModel):
    """A piece of the model's own thinking, as the Responses endpoint hands it to the
    stream (chat sends it as ``delta.reasoning``, like a strategy's steps)."""

    text: str


@dataclass
class Open:
    """The output item being written, and its place in the output."""

    item: OutputItem
    index: int
    parts: list[str] = field(default_factory=list)  # a message's text, a call's arguments
    thought: list[str] = field(default_factory=list)  # a reasoning item's thinking


class ResponsesStream:
    """One request's event writer (its state is this stream's: one instance a stream)."""

    def __init__(self, shell: Shell, head: ResponseHead,
                 on_done: Callable[[ResponseObject], None] | None = None):
        self.shell, self.head, self.on_done = shell, head, on_done
        self.seq = 0
        self.output: list[OutputItem] = []
        self.open: Open | None = None
        self.finish: str | None = None

    def event(self, type_: str, **fields) -> str:
        ev = ResponseEvent(type=type_, sequence_number=self.seq, **fields)
        self.seq += 1
        return f"event: {type_}\ndata: {ev.model_dump_json(exclude_none=True)}\n\n"

    async def events(self, chunks: AsyncIterator) -> AsyncIterator[str]:
        shell = self.shell(self.head, status="in_progress")
        yield self.event("response.created", response=shell)
        yield self.event("response.in_progress", response=shell)
        async for chunk in chunks:
            if isinstance(chunk, str):  # a keep-alive comment
                yield chunk
            elif isinstance(chunk, Thinking):
                for line in self.thinking(chunk.text):
                    yield line
            elif isinstance(chunk, ChatCompletionChunk):
                for line in self.chunk(chunk):
                    yield line

    def chunk(self, chunk: ChatCompletionChunk) -> Iterator[str]:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.reasoning_content:
                yield from self.step(delta.reasoning_content)
            if delta.content:
                yield from self.text(delta.content)
            for call in delta.tool_calls or []:
                yield from self.call(call)
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason
                if not self.output and self.open is None:
                    yield from self.text("")  # an empty answer is still a message
                yield from self.close()
        if chunk.usage is not None:
            yield from self.close()
            status = finished(self.finish)
            done = self.shell(self.head, **status, output=self.output,
                              usage=usage(chunk.usage), refinery=chunk.refinery)
            if self.on_done is not None:
                self.on_done(done)
            kind = "response.incomplete" if status["status"] == "incomplete" else \
                "response.completed"
            yield self.event(kind, response=done)

    def opened(self, item: OutputItem) -> Iterator[str]:
        yield from self.close()
        self.open = Open(item, len(self.output))
        yield self.event("response.output_item.added", output_index=self.open.index, item=item)

    def reasoning_item(self) -> Iterator[str]:
        """Open the reasoning item if none is open (nothing when the answer has begun)."""
        if self.open is None:
            yield from self.opened(ReasoningItem(id=item_id("rs"), status="in_progress"))

    def thinking(self, text: str) -> Iterator[str]:
        """A piece of the model's thinking: the reasoning item's ``reasoning_text``."""
        yield from self.reasoning_item()
        if self.open is None or not isinstance(self.open.item, ReasoningItem):
            return  # the answer has begun: late thinking is not shown
        self.open.thought.append(text)
        yield self.event("response.reasoning_text.delta", **self.at(), delta=text)

    def step(self, text: str) -> Iterator[str]:
        """A strategy step: a summary part of the reasoning item (opened if needed)."""
        text = text.rstrip("\n")  # chat's separator between steps; here each is a part
        yield from self.reasoning_item()
        if self.open is None or not isinstance(self.open.item, ReasoningItem):
            return  # the answer has begun: a late step is not shown
        item, k = self.open.item, len(self.open.parts)
        where = {"item_id": item.id, "output_index": self.open.index, "summary_index": k}
        self.open.parts.append(text)
        yield self.event("response.reasoning_summary_part.added", **where, part=SummaryText())
        yield self.event("response.reasoning_summary_text.delta", **where, delta=text)
        yield self.event("response.reasoning_summary_text.done", **where, text=text)
        yield self.event("response.reasoning_summary_part.done", **where,
                         part=SummaryText(text=text))

    def text(self, text: str) -> Iterator[str]:
        if self.open is None or not isinstance(self.open.item, MessageItem):
            yield from self.opened(MessageItem(id=item_id("msg"), status="in_progress"))
            yield self.event("response.content_part.added", **self.at(), part=OutputText())
        assert self.open is not None
        self.open.parts.append(text)
        if text:
            yield self.event("response.output_text.delta", **self.at(), delta=text,
                             logprobs=[])

    def call(self, call: DeltaToolCall) -> Iterator[str]:
        if call.id is not None:  # the first piece of a call names it
            yield from self.opened(FunctionCallItem(
                id=item_id("fc"), call_id=call.id, name=call.function.name or "",
                status="in_progress"))
        if self.open is None or not isinstance(self.open.item, FunctionCallItem):
            return
        if call.function.arguments:
            self.open.parts.append(call.function.arguments)
            yield self.event("response.function_call_arguments.delta",
                             item_id=self.open.item.id, output_index=self.open.index,
                             delta=call.function.arguments)

    def at(self) -> dict:
        assert self.open is not None
        return {"item_id": self.open.item.id, "output_index": self.open.index,
                "content_index": 0}

    def close(self) -> Iterator[str]:
        """The open item's done events; the item joins the output."""
        if self.open is None:
            return
        o, self.open = self.open, None
        text = "".join(o.parts)
        item = o.item
        if isinstance(item, MessageItem):
            where = {"item_id": item.id, "output_index": o.index, "content_index": 0}
            part = OutputText(text=text)
            yield self.event("response.output_text.done", **where, text=text, logprobs=[])
            yield self.event("response.content_part.done", **where, part=part)
            status = "incomplete" if self.finish == "length" else "completed"
            item = item.model_copy(update={"status": status, "content": [part]})
        elif isinstance(item, FunctionCallItem):
            yield self.event("response.function_call_arguments.done", item_id=item.id,
                             output_index=o.index, arguments=text, name=item.name)
            item = item.model_copy(update={"status": "completed", "arguments": text})
        else:
            thought = "".join(o.thought)
            if thought:
                yield self.event("response.reasoning_text.done", item_id=item.id,
                                 output_index=o.index, content_index=0, text=thought)
            item = item.model_copy(update={"status": "completed", "summary": [
                SummaryText(text=t) for t in o.parts], "content": [
                ReasoningText(text=thought)] if thought else None})
        self.output.append(item)
        yield self.event("response.output_item.done", output_index=o.index, item=item)

    def failed(self, exc: BaseException) -> list[str]:
        """What a stream that failed after it began sends: ``error``, ``response.failed``."""
        body = openai_error(exc)[1].error
        code = str(body.code or body.type)
        gone = self.shell(self.head, status="failed", output=self.output,
                          error=ResponseError(code=code, message=body.message))
        return [self.event("error", code=code, message=body.message, param=body.param),
                self.event("response.failed", response=gone)]
