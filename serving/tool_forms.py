"""Forms of a chat request's tools that mean a plain one: ``allowed_tools`` and the
legacy ``functions``.

``plain_tools`` rewrites them before the serve path, so that tool choice has one
home (``serving.structured``):

- ``tool_choice: {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}``
  is the request with only the allowed tools, and ``tool_choice`` its mode
  (``auto`` or ``required``, served exactly as those choices are).
- ``functions`` + ``function_call`` (OpenAI's legacy form, which it still
  accepts) are ``tools`` + ``tool_choice`` (``"none"``, ``"auto"``, or
  ``{"name"}``: that function), one call at most; earlier turns in that form (an
  assistant's ``function_call``, a ``function`` message with the result) become
  tool calls and tool results. The answer comes back in the same form, as
  ``message.function_call`` (``FunctionsEndpoint``).

Example:
    >>> req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
    ...     {"role": "user", "content": "Weather in Paris?"}],
    ...     "functions": [{"name": "get_weather"}], "function_call": {"name": "get_weather"}})
    >>> plain = plain_tools(req)
    >>> plain.tools[0].function.name, plain.tool_choice.function.name
    ('get_weather', 'get_weather')
"""

from __future__ import annotations

from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import TokenLogprob
from refinery.serving.endpoints import CHAT, Answer, ChatEndpoint, ResponseHead
from refinery.serving.protocol import (
    AllowedToolsChoice,
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    DeltaMessage,
    FunctionName,
    NamedToolChoice,
    ToolCall,
)

__all__ = ["FUNCTIONS", "LEGACY_PARAMS", "FunctionsEndpoint", "endpoint_for", "plain_tools"]

# The plain request's field names in errors, as a legacy request calls them.
LEGACY_PARAMS = {"tools": "functions", "tool_choice": "function_call"}


def plain_tools(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """``req`` with allowed tools and legacy functions as plain tools and tool_choice.

    Raises:
        InvalidRequestError: ``functions`` beside ``tools``, ``function_call``
            without ``functions``, an allowed tool that is not in ``tools``.
    """
    if req.functions is not None or req.function_call is not None:
        req = from_functions(req)
    elif any(m.role == "function" or m.function_call for m in req.messages):
        req = req.model_copy(update={"messages": legacy_turns(req.messages)})
    choice = req.tool_choice
    if not isinstance(choice, AllowedToolsChoice):
        return req
    names = [t.function.name for t in choice.allowed_tools.tools]
    known = [t.function.name for t in req.tools or []]
    if unknown := [n for n in names if n not in known]:
        raise InvalidRequestError(f"allowed_tools names {', '.join(map(repr, unknown))}, not "
                                  f"in tools (known: {', '.join(known) or 'none'})",
                                  param="tool_choice")
    return req.model_copy(update={"tool_choice": choice.allowed_tools.mode, "tools": [
        t for t in req.tools or [] if t.function.name in names]})


def from_functions(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """The legacy form as tools: functions, the choice, and the earlier turns."""
    if req.functions is None:
        raise InvalidRequestError("function_call needs functions", param="function_call")
    if req.tools is not None:
        raise InvalidRequestError("send tools or functions (the legacy form), not both",
                                  param="functions")
    call = req.function_call
    choice = (NamedToolChoice(type="function", function=FunctionName(name=call.name))
              if isinstance(call, FunctionName) else call)
    return req.model_copy(update={
        "tools": [ChatTool(type="function", function=f) for f in req.functions],
        "tool_choice": choice, "parallel_tool_calls": False,
        "messages": legacy_turns(req.messages)})


def legacy_turns(messages: list[ChatMessage]) -> list[ChatMessage]:
    """An assistant's ``function_call`` as a tool call, a ``function`` message (its
    result) as the tool message that answers it."""
    out, last_call = [], None
    for k, m in enumerate(messages):
        if m.role == "assistant" and m.function_call is not None:
            last_call = f"call_legacy_{k}"
            m = m.model_copy(update={"function_call": None, "tool_calls": [
                ToolCall(id=last_call, function=m.function_call)]})
        elif m.role == "function":
            m = ChatMessage(role="tool", name=m.name, content=m.content,
                            tool_call_id=last_call)
        out.append(m)
    return out


class FunctionsEndpoint(ChatEndpoint):
    """Chat for a request that sent ``functions``: a call is ``function_call`` (in the
    whole message and in stream deltas), its finish ``function_call``, as OpenAI's."""

    def chunk(self, head: ResponseHead, i: int, delta: DeltaMessage, finish: str | None = None,
              logprobs: list[TokenLogprob] | None = None) -> ChatCompletionChunk:
        if delta.tool_calls:
            delta = delta.model_copy(update={"tool_calls": None,
                                             "function_call": delta.tool_calls[0].function})
        return super().chunk(head, i, delta, legacy_finish(finish), logprobs)

    def choice(self, head: ResponseHead, i: int, ans: Answer) -> ChatChoice:
        plain = super().choice(head, i, ans)
        calls = plain.message.tool_calls
        if not calls:
            return plain
        message = plain.message.model_copy(update={"tool_calls": None,
                                                   "function_call": calls[0].function})
        return plain.model_copy(update={"message": message,
                                        "finish_reason": legacy_finish(plain.finish_reason)})


def legacy_finish(reason: str | None) -> str | None:
    return "function_call" if reason == "tool_calls" else reason


FUNCTIONS = FunctionsEndpoint()


def endpoint_for(req: ChatCompletionRequest) -> ChatEndpoint:
    """The chat endpoint that answers ``req`` in the form it asked in."""
    return FUNCTIONS if req.functions is not None else CHAT
