"""``/v1/responses`` on the chat serve path: the request as a chat request, the answer
as a Responses object, the chat stream as Responses events.

There is one serve path. A Responses request becomes the chat request it
means (``chat_request``: ``input`` and ``instructions`` as messages,
``max_output_tokens``, ``text.format`` as ``response_format``, flat function
tools as chat tools, ``reasoning.effort`` as ``reasoning_effort``), so model
names, presets, OptiLLM names, limits, constraints and tool calls behave as on
chat. :class:`ResponsesEndpoint` is the chat adapter with its own last step:
the chat response becomes a Responses object, and a stream of chat chunks
becomes the Responses event sequence (``ResponsesStream``).

Under a strategy, its steps are a ``reasoning`` output item (one summary text a
step) before the ``message`` item; on passthrough there is no reasoning item.
Nothing is stored: ``previous_response_id`` and ``background`` are refused.

Example:
    >>> chat = chat_request(ResponsesRequest(model="m", input="hi", instructions="Be brief."))
    >>> [m.role for m in chat.messages]
    ['system', 'user']
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from pydantic import BaseModel

from refinery.engine.errors import InvalidRequestError, RefineryError
from refinery.engine.trace import Trace
from refinery.serving.endpoints import ChatEndpoint, OnError, ResponseHead
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatTool,
    ContentPart,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonSchemaFormat,
    NamedToolChoice,
    RefineryInfo,
    ResponseFormat,
    StreamOptions,
    ToolCall,
)
from refinery.serving.responses_protocol import (
    FunctionCallItem,
    InputItem,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ResponseObject,
    ResponsesRequest,
    SummaryText,
)
from refinery.serving.responses_stream import ResponsesStream, finished, item_id, usage
from refinery.serving.service import Outcome
from refinery.serving.streaming import reasoning_text

__all__ = ["ResponsesEndpoint", "chat_request"]

# Chat field names in errors, as the Responses request calls them.
PARAMS = {"messages": "input", "response_format": "text.format",
          "max_completion_tokens": "max_output_tokens", "reasoning_effort": "reasoning.effort"}


def chat_request(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request ``req`` means.

    Raises:
        InvalidRequestError: stored-response features, a non-function tool, an
            input item refinery cannot read.
    """
    if req.previous_response_id is not None:
        raise InvalidRequestError("previous_response_id needs stored responses, and this "
                                  "server stores none: send the whole conversation in input",
                                  param="previous_response_id")
    if req.background:
        raise InvalidRequestError("background responses are not supported (nothing is "
                                  "stored to poll)", param="background")
    messages = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    messages += input_messages(req.input)
    if not messages:
        raise InvalidRequestError("input has no message", param="input")
    effort = req.reasoning.effort if req.reasoning else None
    return ChatCompletionRequest(
        model=req.model, messages=messages, max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, stream=req.stream,
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        response_format=response_format(req), tools=chat_tools(req), user=req.user,
        tool_choice=tool_choice(req), parallel_tool_calls=req.parallel_tool_calls,
        reasoning_effort=effort, refinery=req.refinery, optillm_approach=req.optillm_approach)


def input_messages(value: str | list[InputItem]) -> list[ChatMessage]:
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    out: list[ChatMessage] = []
    for i, item in enumerate(value):
        if item.type == "message":
            if item.role is None:
                raise InvalidRequestError("a message needs a role", param=f"input.{i}.role")
            content = item.content
            if isinstance(content, list):  # input_text, and output_text of earlier turns
                content = [ContentPart(type="text", text=p.text) for p in content
                           if p.type in ("input_text", "output_text", "text")]
            out.append(ChatMessage(role=item.role, content=content))
        elif item.type == "function_call":
            call = ToolCall(id=item.call_id or "", function=FunctionCall(
                name=item.name or "", arguments=item.arguments or "{}"))
            out.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif item.type == "function_call_output":
            out.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                   content=item.output or ""))
        elif item.type != "reasoning":  # earlier reasoning is not replayed to the model
            raise InvalidRequestError(f"input item type {item.type!r} is not supported "
                                      "(message, function_call, function_call_output, "
                                      "reasoning)", param=f"input.{i}.type")
    return out


def response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat(type="json_object")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=fmt.name or "response", description=fmt.description, schema=fmt.json_schema,
        strict=fmt.strict))


def chat_tools(req: ResponsesRequest) -> list[ChatTool] | None:
    if not req.tools:
        return None
    tools = []
    for i, t in enumerate(req.tools):
        if t.type != "function" or not t.name:
            raise InvalidRequestError(
                f"tools.{i}: only function tools with a name are supported, not "
                f"{t.type!r}", param=f"tools.{i}")
        tools.append(ChatTool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.parameters,
            strict=t.strict)))
    return tools


def tool_choice(req: ResponsesRequest):
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    return NamedToolChoice(type="function", function=FunctionName(name=choice.name))


def steps_of(trace: Trace) -> list[str]:
    """A strategy run's steps as the stream shows them, but the answer's own sample."""
    answer_events = set(trace.attempt.events[-1:]) if trace.attempt else set()
    return [text.rstrip("\n") for ev in trace.events if ev.id not in answer_events
            if (text := reasoning_text(ev))]


class ResponsesEndpoint(ChatEndpoint):
    """``/v1/responses``: one instance per request (it echoes the request's fields)."""

    name = "responses"
    id_prefix = "resp"
    separator = "_"

    def __init__(self, request: ResponsesRequest):
        self.request = request

    def shell(self, head: ResponseHead, **fields) -> ResponseObject:
        """The response object with the request's fields echoed, as OpenAI's is."""
        r = self.request
        fmt = r.text.format.model_dump(by_alias=True, exclude_none=True) if (
            r.text and r.text.format) else {"type": "text"}
        return ResponseObject(
            id=head.id, created_at=head.created, model=head.model, instructions=r.instructions,
            max_output_tokens=r.max_output_tokens, temperature=r.temperature, top_p=r.top_p,
            text={"format": fmt}, tool_choice=r.tool_choice or "auto",
            tools=[t.model_dump(exclude_none=True) for t in r.tools or []],
            parallel_tool_calls=r.parallel_tool_calls is not False,
            reasoning=r.reasoning or {}, metadata=r.metadata or {}, user=r.user, **fields)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> ResponseObject:
        chat = super().response(head, outcome, info)
        output: list[OutputItem] = []
        steps = steps_of(outcome.traces[0]) if info.strategy is not None else []
        if steps:
            output.append(ReasoningItem(id=item_id("rs"), summary=[
                SummaryText(text=s) for s in steps]))
        output += answer_items(chat)
        return self.shell(head, **finished(chat.choices[0].finish_reason), output=output,
                          usage=usage(chat.usage), refinery=info)

    def streamed(self, head: ResponseHead, chunks: AsyncIterator[BaseModel | str]
                 ) -> tuple[AsyncIterator[BaseModel | str], OnError]:
        stream = ResponsesStream(self.shell, head)
        return stream.events(chunks), stream.failed


def answer_items(chat: ChatCompletionResponse) -> Iterator[OutputItem]:
    """The chat answer as output items: its tool calls, or one message."""
    message = chat.choices[0].message
    if message.tool_calls:
        for call in message.tool_calls:
            yield FunctionCallItem(id=item_id("fc"), call_id=call.id, name=call.function.name,
                                   arguments=call.function.arguments)
        return
    status = "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    yield MessageItem(id=item_id("msg"), status=status,
                      content=[OutputText(text=message.content or "")])


def renamed(exc: RefineryError) -> RefineryError:
    """``exc`` naming the Responses field where it names a chat one."""
    if exc.param is not None:
        head, _, rest = exc.param.partition(".")
        exc.param = PARAMS.get(head, head) + (f".{rest}" if rest else "")
    return exc
