"""Endpoint adapters: what differs between chat and completions, and nothing else.

The serve path (``serving.serve``) and the stream (``serving.streaming``) are
written once; an adapter builds the endpoint's own response, chunks and
usage chunk. Chat opens every choice with a role chunk and shows strategy
steps as ``reasoning`` (and ``reasoning_content``, the same text), after the
model's own thinking; completions show only the model's thinking.

The reply's shape (``ResponseHead.reply``): chat logprobs are
``{"content": [token...]}`` in OpenAI's shape, completions' the legacy
parallel lists with ``text_offset``; a forced named tool call is
``message.tool_calls`` (content null, finish ``stop``), streamed as argument
deltas; the calls of ``"auto"`` and ``"required"`` are parsed from the envelope
(``engine.tool_calls``; finish ``tool_calls``) and sent whole at the end of a
stream, an ``"auto"`` text answer streams as content. A call cut off by the token
limit is dropped, never shown as text, and the choice finishes ``length``.

Example:
    >>> head = ResponseHead.new(CHAT, model="ssr@my-model")
    >>> CHAT.delta(head, 0, "Hello").model_dump(exclude_none=True)["choices"][0]["delta"]
    {'content': 'Hello'}
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from pydantic import BaseModel

from refinery.engine.run import answer_completion, reasoning_tokens
from refinery.engine.tool_calls import Call, CallDelta, parse_calls
from refinery.engine.trace import Trace
from refinery.engine.types import TokenLogprob, TopLogprob
from refinery.serving.protocol import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChoiceLogprobs,
    ChunkChoice,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
    CompletionTokensDetails,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    PromptTokensDetails,
    RefineryInfo,
    ResponseMessage,
    ToolCall,
    UsageInfo,
)
from refinery.serving.service import Outcome, Prepared, trace_summary
from refinery.serving.structured import Reply

# What a stream that failed after it began sends instead of the OpenAI error chunk.
OnError = Callable[[BaseException], list[str]]
MIN_LOGPROB = -9999.0  # what OpenAI and vLLM send for -inf (JSON has no infinity)


def new_call_id() -> str:
    """A tool call id, ``call_<24 hex>`` as OpenAI's."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ResponseHead:
    """What every chunk and the response of one request share: id, time, model, reply."""

    id: str
    created: int
    model: str
    reply: Reply = field(default_factory=Reply)

    @classmethod
    def new(cls, endpoint: Endpoint, model: str, reply: Reply | None = None,
            id: str | None = None) -> ResponseHead:
        return cls(id=id or endpoint.new_id(), created=int(time.time()),
                   model=model, reply=reply or Reply())


@dataclass(frozen=True)
class Answer:
    """A choice's result: text, finish reason, logprobs (if asked and known), reasoning.

    ``thinking`` is the model's own thinking in the sample that became the answer
    (its reasoning parser's ``Completion.reasoning``); ``reasoning`` a shaped answer's
    solution. ``shown_reasoning`` is what the reasoning fields carry: both, thinking first.

    Example:
        >>> Answer("4", thinking="2+2 is 4.", reasoning="[cot] 4").shown_reasoning
        '2+2 is 4.\\n\\n[cot] 4'
    """

    text: str
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None  # a shaped answer's solution (engine.run.conform)
    thinking: str | None = None
    calls: list[Call] | None = None  # the backend's parse of native tool calls

    @property
    def shown_reasoning(self) -> str | None:
        return "\n\n".join(t for t in (self.thinking, self.reasoning) if t) or None


def public_finish(reason: str) -> str:
    """A finish reason as clients read it: a confidence stop (DeepConf's monitor cut the
    text before its end) is ``length``; ``loop`` stays (documented); the rest are OpenAI's."""
    return "length" if reason == "confidence" else reason


def answer(trace: Trace, logprobs: bool = False) -> Answer:
    """A choice's answer; its logprobs are those of the sample that became it, if any."""
    if trace.attempt is None:
        return Answer("")
    comp = answer_completion(trace)
    return Answer(trace.attempt.text, public_finish(trace.attempt.finish_reason),
                  comp.token_logprobs if comp is not None and logprobs else None,
                  trace.attempt.metadata.get("reasoning"),
                  comp.reasoning if comp is not None else None,
                  comp.tool_calls if comp is not None else None)


def finite(tokens: list[TokenLogprob]) -> list[TokenLogprob]:
    """``tokens`` with -inf logprobs (and alternatives') raised to :data:`MIN_LOGPROB`."""
    def fix(t: TopLogprob) -> dict:
        return {"logprob": max(t.logprob, MIN_LOGPROB)}
    return [t.model_copy(update={**fix(t), "top_logprobs": [
        a.model_copy(update=fix(a)) for a in t.top_logprobs]}) for t in tokens]


def legacy_logprobs(tokens: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """Completions' logprobs: parallel lists; ``offset`` is the text before ``tokens``."""
    out = CompletionLogprobs()
    for t in finite(tokens):
        out.tokens.append(t.token)
        out.token_logprobs.append(t.logprob)
        out.top_logprobs.append({t.token: t.logprob,
                                 **{a.token: a.logprob for a in t.top_logprobs}})
        out.text_offset.append(offset)
        offset += len(t.token)
    return out


def usage_info(outcome: Outcome) -> UsageInfo:
    """The response's usage: the run's totals, its reasoning tokens, its cached prompt.

    ``reasoning_tokens`` is the model's own thinking in the returned answers'
    samples (their ``Completion.reasoning_tokens``) plus ``engine.run.reasoning_tokens``:
    every generated token but those of the samples that became the returned
    answers (0 on passthrough). ``prompt_tokens_details`` is sent only when the
    backend reported cached tokens.
    """
    u = outcome.usage
    cached = (PromptTokensDetails(cached_tokens=u.cached_tokens)
              if u.cached_tokens is not None else None)
    thinking = sum(comp.reasoning_tokens or 0 for trace in outcome.traces
                   if (comp := answer_completion(trace)) is not None)
    return UsageInfo(prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens,
                     total_tokens=u.total_tokens, prompt_tokens_details=cached,
                     completion_tokens_details=CompletionTokensDetails(
                         reasoning_tokens=thinking + reasoning_tokens(outcome.traces, u)))


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

    name: ClassVar[Literal["chat", "completion", "responses"]]
    id_prefix: ClassVar[str]
    separator: ClassVar[str] = "-"

    def new_id(self) -> str:
        """A response id: ``chatcmpl-<32 hex>``, ``cmpl-<32 hex>``, ``resp_<32 hex>``."""
        return f"{self.id_prefix}{self.separator}{uuid.uuid4().hex}"

    def streamed(self, head: ResponseHead, chunks: AsyncIterator[BaseModel | str]
                 ) -> tuple[AsyncIterator[BaseModel | str], OnError | None]:
        """The stream's events from its chunks, and what a failure mid-stream sends
        (None: the OpenAI error chunk). Chat and completions send the chunks as they are."""
        return chunks, None

    def opening(self, head: ResponseHead, i: int) -> BaseModel | None:
        """The chunk that opens choice ``i`` of a stream, if the endpoint has one."""
        return None

    def reasoning(self, head: ResponseHead, i: int, text: str) -> BaseModel | None:
        """A strategy step of choice ``i`` as a chunk, if the endpoint shows steps."""
        return None

    def thinking(self, head: ResponseHead, i: int, text: str) -> BaseModel | None:
        """A piece of the model's own thinking in choice ``i``'s answer, as a chunk."""
        return None

    def delta(self, head: ResponseHead, i: int, text: str,
              logprobs: list[TokenLogprob] | None = None, offset: int = 0) -> BaseModel | None:
        """Answer text of choice ``i`` as a chunk (None: held back until the end).

        ``offset`` is how much of the choice's text was streamed before this piece.
        """
        raise NotImplementedError

    def call_delta(self, head: ResponseHead, i: int, piece: CallDelta,
                   call_id: str | None) -> BaseModel | None:
        """A streamed piece of a native tool call (``call_id``: on its first piece)."""
        return None

    def closing(self, head: ResponseHead, i: int, ans: Answer, sent: int,
                calls_sent: bool = False) -> Iterator[BaseModel]:
        """The last chunks of choice ``i``: its text if none was streamed (its native
        calls, unless ``calls_sent``), the finish."""
        if ans.text and not sent:
            if (chunk := self.delta(head, i, ans.text, ans.logprobs)) is not None:
                yield chunk
        yield self.finish(head, i, ans.finish_reason)

    def finish(self, head: ResponseHead, i: int, reason: str) -> BaseModel:
        raise NotImplementedError

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> BaseModel:
        raise NotImplementedError

    def response(self, head: ResponseHead, outcome: Outcome, info: RefineryInfo) -> BaseModel:
        raise NotImplementedError


def envelope_calls(text: str) -> tuple[list[ToolCall], bool] | None:
    """The calls of an answer in the tool-call envelope, and whether one was cut off
    (its partial call dropped); None: a text answer."""
    turn = parse_calls(text)
    if not turn.calls and not turn.cut:
        return None
    return [ToolCall(id=new_call_id(), function=FunctionCall(
        name=c.name, arguments=c.arguments_json)) for c in turn.calls], turn.cut


def tool_calls(reply: Reply, ans: Answer) -> tuple[list[ToolCall], bool] | None:
    """A choice's tool calls and whether the last was cut off (None: a text reply)."""
    if reply.tools == "named" and reply.function is not None:
        return [ToolCall(id=new_call_id(),
                         function=FunctionCall(name=reply.function, arguments=ans.text))], False
    if reply.tools == "required":
        return envelope_calls(ans.text) or ([], False)  # never text, even if unparsed
    if reply.tools == "auto":
        return envelope_calls(ans.text)
    if reply.tools == "native" and ans.calls:
        return [ToolCall(id=new_call_id(), function=FunctionCall(
            name=c.name, arguments=c.arguments_json)) for c in ans.calls], False
    return None


def calls_finish(reply: Reply, calls: list[ToolCall], cut: bool, finish: str) -> str:
    """The finish reason of a tool-call answer: ``length`` when a call was cut off,
    ``tool_calls`` for calls the model chose (a named call finishes with ``stop``, as
    OpenAI's and vLLM's do)."""
    if cut:
        return "length"
    if calls and reply.tools in ("auto", "required", "native") and finish == "stop":
        return "tool_calls"
    return finish


class ChatEndpoint(Endpoint):
    """``/v1/chat/completions``."""

    name = "chat"
    id_prefix = "chatcmpl"

    def chunk(self, head: ResponseHead, i: int, delta: DeltaMessage, finish: str | None = None,
              logprobs: list[TokenLogprob] | None = None) -> ChatCompletionChunk:
        lp = ChoiceLogprobs(content=finite(logprobs)) if logprobs is not None else None
        return ChatCompletionChunk(id=head.id, created=head.created, model=head.model,
                                   choices=[ChunkChoice(index=i, delta=delta, logprobs=lp,
                                                        finish_reason=finish)])

    def opening(self, head: ResponseHead, i: int) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(role="assistant", content=""))

    def reasoning(self, head: ResponseHead, i: int, text: str) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(reasoning=text, reasoning_content=text))

    def thinking(self, head: ResponseHead, i: int, text: str) -> ChatCompletionChunk:
        return self.reasoning(head, i, text)

    def delta(self, head: ResponseHead, i: int, text: str,
              logprobs: list[TokenLogprob] | None = None,
              offset: int = 0) -> ChatCompletionChunk | None:
        reply = head.reply
        if reply.tools == "required":
            return None  # the calls are parsed whole, at the end
        if reply.tools == "named":
            first = offset == 0  # the first piece opens the call: id, type, name
            call = DeltaToolCall(index=0, id=new_call_id() if first else None,
                                 type="function" if first else None,
                                 function=DeltaFunctionCall(
                                     name=reply.function if first else None, arguments=text))
            return self.chunk(head, i, DeltaMessage(tool_calls=[call]), logprobs=logprobs)
        return self.chunk(head, i, DeltaMessage(content=text), logprobs=logprobs)

    def call_delta(self, head: ResponseHead, i: int, piece: CallDelta,
                   call_id: str | None) -> ChatCompletionChunk:
        first = call_id is not None  # the first piece opens the call: id, type, name
        return self.chunk(head, i, DeltaMessage(tool_calls=[DeltaToolCall(
            index=piece.index, id=call_id, type="function" if first else None,
            function=DeltaFunctionCall(name=piece.name if first else None,
                                       arguments=piece.arguments))]))

    def closing(self, head: ResponseHead, i: int, ans: Answer, sent: int,
                calls_sent: bool = False) -> Iterator[ChatCompletionChunk]:
        found = tool_calls(head.reply, ans) if head.reply.tools != "named" else None
        if found is None:
            yield from super().closing(head, i, ans, sent)
            return
        calls, cut = found
        if head.reply.tools == "native" and ans.text and not sent:
            yield self.chunk(head, i, DeltaMessage(content=ans.text))
        if calls and not calls_sent:
            yield self.chunk(head, i, DeltaMessage(tool_calls=[
                DeltaToolCall(index=j, id=c.id, type="function", function=DeltaFunctionCall(
                    name=c.function.name, arguments=c.function.arguments))
                for j, c in enumerate(calls)]), logprobs=ans.logprobs)
        yield self.finish(head, i, calls_finish(head.reply, calls, cut, ans.finish_reason))

    def finish(self, head: ResponseHead, i: int, reason: str) -> ChatCompletionChunk:
        return self.chunk(head, i, DeltaMessage(), reason)

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=head.id, created=head.created, model=head.model,
                                   choices=[], usage=usage, refinery=info)

    def choice(self, head: ResponseHead, i: int, ans: Answer) -> ChatChoice:
        """One choice of the whole response: text, or the tool calls the reply asks for."""
        found = tool_calls(head.reply, ans)
        calls, cut = found if found is not None else (None, False)
        finish = (calls_finish(head.reply, calls, cut, ans.finish_reason)
                  if calls is not None else ans.finish_reason)
        shown = ans.shown_reasoning
        # A native call's answer keeps the text the model wrote beside its calls.
        text = ans.text or None if head.reply.tools == "native" else None
        message = ResponseMessage(content=text if calls is not None else ans.text,
                                  tool_calls=calls or None, reasoning=shown,
                                  reasoning_content=shown)
        logprobs = (ChoiceLogprobs(content=finite(ans.logprobs))
                    if ans.logprobs is not None else None)
        return ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=finish)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> ChatCompletionResponse:
        choices = [self.choice(head, i, answer(t, head.reply.logprobs))
                   for i, t in enumerate(outcome.traces)]
        return ChatCompletionResponse(id=head.id, created=head.created, model=head.model,
                                      choices=choices, usage=usage_info(outcome),
                                      refinery=info)


class CompletionEndpoint(Endpoint):
    """``/v1/completions``: text chunks, no role, no strategy steps, no extension on
    chunks; the model's own thinking in ``reasoning`` / ``reasoning_content``."""

    name = "completion"
    id_prefix = "cmpl"

    def chunk(self, head: ResponseHead, i: int, text: str, finish: str | None = None,
              logprobs: CompletionLogprobs | None = None) -> CompletionChunk:
        return CompletionChunk(id=head.id, created=head.created, model=head.model,
                               choices=[CompletionChoice(index=i, text=text, logprobs=logprobs,
                                                         finish_reason=finish)])

    def delta(self, head: ResponseHead, i: int, text: str,
              logprobs: list[TokenLogprob] | None = None, offset: int = 0) -> CompletionChunk:
        lp = legacy_logprobs(logprobs, offset) if logprobs is not None else None
        return self.chunk(head, i, text, logprobs=lp)

    def thinking(self, head: ResponseHead, i: int, text: str) -> CompletionChunk:
        return CompletionChunk(id=head.id, created=head.created, model=head.model, choices=[
            CompletionChoice(index=i, text="", finish_reason=None, reasoning=text,
                             reasoning_content=text)])

    def finish(self, head: ResponseHead, i: int, reason: str) -> CompletionChunk:
        return self.chunk(head, i, "", reason)

    def usage_chunk(self, head: ResponseHead, usage: UsageInfo,
                    info: RefineryInfo) -> CompletionChunk:
        return CompletionChunk(id=head.id, created=head.created, model=head.model,
                               choices=[], usage=usage)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> CompletionResponse:
        choices = []
        for i, trace in enumerate(outcome.traces):
            ans = answer(trace, head.reply.logprobs)
            lp = legacy_logprobs(ans.logprobs, 0) if ans.logprobs is not None else None
            choices.append(CompletionChoice(index=i, text=ans.text, logprobs=lp,
                                            finish_reason=ans.finish_reason,
                                            reasoning=ans.thinking,
                                            reasoning_content=ans.thinking))
        return CompletionResponse(id=head.id, created=head.created, model=head.model,
                                  choices=choices, usage=usage_info(outcome), refinery=info)


CHAT = ChatEndpoint()
COMPLETION = CompletionEndpoint()
