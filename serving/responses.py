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
step) before the ``message`` item; the model's own thinking (a reasoning parser's)
is that item's ``content`` (one ``reasoning_text``). On passthrough without
thinking there is no reasoning item.
Earlier turns (``previous_response_id``, ``conversation``) come before the input,
and the finished response is kept, by the request's ``Thread``
(serving/conversations.py); ``background`` is refused.

Example:
    >>> chat = chat_request(ResponsesRequest(model="m", input="hi", instructions="Be brief."))
    >>> [m.role for m in chat.messages]
    ['system', 'user']
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from pydantic import BaseModel

from refinery.engine.errors import InvalidRequestError
from refinery.engine.trace import Trace
from refinery.serving.conversations import Thread
from refinery.serving.endpoints import ChatEndpoint, OnError, ResponseHead, answer
from refinery.serving.protocol import (
    AllowedTools,
    AllowedToolsChoice,
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
    AllowedToolsChoice as ResponsesAllowedTools,
)
from refinery.serving.responses_protocol import (
    FunctionCallItem,
    InputContent,
    InputItem,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    SummaryText,
)
from refinery.serving.responses_stream import (
    ResponsesStream,
    Thinking,
    finished,
    item_id,
    usage,
)
from refinery.serving.service import Outcome
from refinery.serving.streaming import reasoning_text
from refinery.serving.tool_forms import plain_tools

__all__ = ["PARAMS", "ResponsesEndpoint", "chat_request"]

# Chat field names in errors, as the Responses request calls them.
PARAMS = {"messages": "input", "response_format": "text.format",
          "max_completion_tokens": "max_output_tokens", "reasoning_effort": "reasoning.effort"}


def chat_request(req: ResponsesRequest,
                 items: list[InputItem] | None = None) -> ChatCompletionRequest:
    """The chat request ``req`` means, reading ``items`` (the earlier turns' and its
    own: ``Thread.items``) as its input if given.

    Raises:
        InvalidRequestError: background, a non-function tool, an input item
            refinery cannot read.
    """
    if req.background:
        raise InvalidRequestError("background responses are not supported (nothing "
                                  "runs after the request ends)", param="background")
    messages = [ChatMessage(role="system", content=req.instructions)] if req.instructions else []
    messages += input_messages(req.input if items is None else items)
    if not messages:
        raise InvalidRequestError("input has no message", param="input")
    effort = req.reasoning.effort if req.reasoning else None
    return plain_tools(ChatCompletionRequest(
        model=req.model, messages=messages, max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, stream=req.stream,
        stream_options=StreamOptions(include_usage=True) if req.stream else None,
        response_format=response_format(req), tools=chat_tools(req), user=req.user,
        tool_choice=tool_choice(req), parallel_tool_calls=req.parallel_tool_calls,
        reasoning_effort=effort, refinery=req.refinery, optillm_approach=req.optillm_approach))


def input_messages(value: str | list[InputItem], param: str = "input") -> list[ChatMessage]:
    """Input items as chat messages (``param``: how errors name the list)."""
    if isinstance(value, str):
        return [ChatMessage(role="user", content=value)]
    out: list[ChatMessage] = []
    for i, item in enumerate(value):
        if item.type == "message":
            if item.role is None:
                raise InvalidRequestError("a message needs a role", param=f"{param}[{i}].role")
            out.append(ChatMessage(role=item.role, content=chat_content(item.content)))
        elif item.type == "function_call":
            call = ToolCall(id=item.call_id or "", function=FunctionCall(
                name=item.name or "", arguments=item.arguments or "{}"))
            out.append(ChatMessage(role="assistant", tool_calls=[call]))
        elif item.type == "function_call_output":
            out.append(ChatMessage(role="tool", tool_call_id=item.call_id,
                                   content=chat_content(item.output) or ""))
        elif item.type != "reasoning":  # earlier reasoning is not replayed to the model
            raise InvalidRequestError(f"input item type {item.type!r} is not supported "
                                      "(message, function_call, function_call_output, "
                                      "reasoning)", param=f"{param}[{i}].type")
    return out


def chat_content(content: str | list[InputContent] | None) -> str | list[ContentPart] | None:
    """Item content as chat content: its text parts (the only kind the schema lets in:
    ``input_text``, and ``output_text`` of earlier turns) as chat text parts."""
    if not isinstance(content, list):
        return content
    return [ContentPart(type="text", text=p.text) for p in content]


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
                f"tools[{i}]: only function tools with a name are supported, not "
                f"{t.type!r}", param=f"tools[{i}]")
        tools.append(ChatTool(type="function", function=FunctionDefinition(
            name=t.name, description=t.description, parameters=t.parameters,
            strict=t.strict)))
    return tools


def tool_choice(req: ResponsesRequest):
    """The chat ``tool_choice`` of ``req``: a mode, a named function, or allowed tools."""
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, ResponsesAllowedTools):
        return AllowedToolsChoice(type="allowed_tools", allowed_tools=AllowedTools(
            mode=choice.mode, tools=[named(t.name, t.type, f"tool_choice.tools[{j}]")
                                     for j, t in enumerate(choice.tools)]))
    return named(choice.name)


def named(name: str | None, kind: str = "function",
          param: str = "tool_choice") -> NamedToolChoice:
    if kind != "function" or not name:
        raise InvalidRequestError(f"only function tools with a name can be chosen, not "
                                  f"{kind!r}", param=param)
    return NamedToolChoice(type="function", function=FunctionName(name=name))


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

    def __init__(self, request: ResponsesRequest, thread: Thread | None = None):
        self.request = request
        self.thread = thread

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
            reasoning=r.reasoning or {}, metadata=r.metadata or {}, user=r.user,
            store=self.thread is not None and self.thread.stores,
            previous_response_id=r.previous_response_id,
            conversation={"id": self.thread.conversation} if (
                self.thread and self.thread.conversation) else None, **fields)

    def response(self, head: ResponseHead, outcome: Outcome,
                 info: RefineryInfo) -> ResponseObject:
        chat = super().response(head, outcome, info)
        output: list[OutputItem] = []
        steps = steps_of(outcome.traces[0]) if info.strategy is not None else []
        thinking = answer(outcome.traces[0]).thinking
        if steps or thinking:
            output.append(ReasoningItem(
                id=item_id("rs"), summary=[SummaryText(text=s) for s in steps],
                content=[ReasoningText(text=thinking)] if thinking else None))
        output += answer_items(chat)
        done = self.shell(head, **finished(chat.choices[0].finish_reason), output=output,
                          usage=usage(chat.usage), refinery=info)
        self.keep(done)
        return done

    def thinking(self, head: ResponseHead, i: int, text: str) -> Thinking:
        return Thinking(text=text)  # the reasoning item's content, not a summary step

    def streamed(self, head: ResponseHead, chunks: AsyncIterator[BaseModel | str]
                 ) -> tuple[AsyncIterator[BaseModel | str], OnError]:
        stream = ResponsesStream(self.shell, head, on_done=self.keep)
        return stream.events(chunks), stream.failed

    def keep(self, response: ResponseObject) -> None:
        """The finished response, stored and appended where its thread says."""
        if self.thread is not None:
            self.thread.keep(response)


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

