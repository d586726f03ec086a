"""What a request asks of its output's shape: a constraint, logprobs, a forced tool call.

``output_of(request)`` reads, validates and reconciles the fields that shape
an answer, before any engine call (a bad schema or regex is a 400 naming the
field):

- ``response_format`` (``text``, ``json_object``, ``json_schema``; ``strict``
  is accepted and the schema is always enforced), vLLM's ``structured_outputs``
  (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``) and its older
  ``guided_json``/``guided_regex``/``guided_choice``/``guided_grammar``. At most
  one constraint per request.
- ``tools`` with ``tool_choice``: ``"auto"`` (the default when tools are given)
  lets the model choose free text or calls in the envelope of ``engine.tool_calls``,
  the calls' arguments under their tools' schemas; ``"required"`` closes the text
  branch; a named function's arguments are generated under its ``parameters``
  schema; ``"none"`` ignores the tools. With ``parallel_tool_calls: false`` an
  answer holds one call at most. A format field (``response_format``, vLLM's
  fields) on the same request shapes the text branch of ``"auto"``; under a
  named or required choice the call takes precedence and the format is left for
  the turn that answers in text, as OpenAI does.
- ``logprobs``/``top_logprobs`` (chat) or ``logprobs: k`` (completions).

The tools are described to the model in a system turn (``tools_prompt``), as a
chat template that takes tools would, and for ``"auto"`` and ``"required"`` one
worked exchange follows it (``tools_example``: a request the first tool answers and
the call to it), which a small model copies where a description alone moves it to
no call; earlier tool calls and tool results in the conversation are rendered as
text in the same envelope (``message_text``).

Over a backend that parses the model's native tool calls (``native=True``: its
``tool_call_parser``, with ``--enable-auto-tool-choice``), ``"auto"`` is the
model's own choice instead (reply ``"native"``): no constraint and no system text,
the tools go to the chat template (``Output.tools``) and the calls are the parser's
(``Completion.tool_calls``). ``"required"`` and a named function keep their
constraint.

Example:
    >>> out = output_of(ChatCompletionRequest.model_validate(
    ...     {"model": "m", "messages": [{"role": "user", "content": "hi"}],
    ...      "response_format": {"type": "json_object"}}))
    >>> out.constraint.kind, out.reply.tools
    ('json_object', 'none')
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from refinery.engine.constraints import Constraint
from refinery.engine.errors import InvalidRequestError
from refinery.engine.tool_calls import (
    DEFAULT_MAX_CALLS,
    EMPTY_OBJECT,
    Exchange,
    Tool,
    as_format,
    demonstration,
    envelope_constraint,
    render_call,
    tools_instructions,
)
from refinery.engine.types import Message
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    CompletionRequest,
    ResponseFormat,
    StructuredOutputs,
)

MAX_SCHEMA_DEPTH = 64  # deeper schemas are refused, not handed to recursive checkers


@dataclass(frozen=True)
class Reply:
    """How a choice's text becomes the response: text, or tool calls; with logprobs?"""

    tools: Literal["none", "auto", "named", "required", "native"] = "none"
    function: str | None = None  # the named function
    logprobs: bool = False


@dataclass(frozen=True)
class Output:
    """The request's output shape: the constraint, the sampling knobs, the reply."""

    constraint: Constraint | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    reply: Reply = field(default_factory=Reply)
    tools_prompt: str | None = None
    tools_example: tuple[Message, ...] = ()  # a shown exchange, after the system turn
    tools: tuple[Tool, ...] = ()  # what the chat template renders (native calls)


def output_of(req: ChatCompletionRequest | CompletionRequest,
              native: bool = False) -> Output:
    """The output shape ``req`` asks for (``native``: ``"auto"`` is the model's own
    tool calls, parsed by the backend).

    Raises:
        InvalidRequestError: a bad schema or regex, two constraints, a tool
            choice that cannot be served, logprob fields OpenAI refuses.
    """
    found = format_constraints(req)
    if len(found) > 1:
        raise InvalidRequestError(
            "only one output constraint per request; got " + ", ".join(p for p, _ in found),
            param=found[1][0])
    tool = (tool_constraint(req, found[0][1] if found else None, native)
            if isinstance(req, ChatCompletionRequest) else None)
    if tool is not None and tool.constraint is not None:  # replaces (or holds) the format's
        found = [("tool_choice", tool.constraint)]
    reply = tool.reply if tool is not None else Reply()
    logprobs, top = logprob_fields(req)
    constraint = found[0][1] if found else None
    return Output(constraint=constraint, logprobs=logprobs, top_logprobs=top,
                  reply=Reply(reply.tools, reply.function, logprobs),
                  tools_prompt=tool.prompt if tool is not None else None,
                  tools_example=tool.example if tool is not None else (),
                  tools=tool.tools if tool is not None else ())


def at(param: str, build: Callable[[], Constraint]) -> Constraint:
    """``build()``, its refusal re-raised naming the request field ``param``."""
    try:
        return build()
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.message, param=param, code=exc.code) from exc


def nesting(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (iteratively: any depth is safe)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in item)
    return deepest


def schema_constraint(schema: Any, param: str, name: str | None = None) -> Constraint:
    """``Constraint.from_schema``, refusals naming ``param``; too deep a schema refused."""
    if nesting(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidRequestError(f"JSON schema nested deeper than {MAX_SCHEMA_DEPTH} "
                                  f"levels", param=param)
    return at(param, lambda: Constraint.from_schema(schema, name=name))


def format_constraints(req: ChatCompletionRequest | CompletionRequest,
                       ) -> list[tuple[str, Constraint]]:
    """Every constraint the request's format fields ask for, with the field's name."""
    found = []
    if (rf := req.response_format) is not None and rf.type != "text":
        found.append(("response_format", response_format_constraint(rf)))
    if req.structured_outputs is not None:
        found += vllm_constraints(req.structured_outputs, "structured_outputs.")
    guided = StructuredOutputs(json=req.guided_json, regex=req.guided_regex,
                               choice=req.guided_choice, grammar=req.guided_grammar)
    return found + vllm_constraints(guided, "guided_")


def response_format_constraint(rf: ResponseFormat) -> Constraint:
    """OpenAI's ``response_format`` (``json_object`` or ``json_schema``) as a Constraint."""
    if rf.type == "json_object":
        return Constraint.any_json()
    spec = rf.json_schema
    if spec is None or spec.json_schema is None:
        raise InvalidRequestError("response_format json_schema needs json_schema.schema",
                                  param="response_format.json_schema.schema")
    return schema_constraint(spec.json_schema, "response_format.json_schema.schema",
                             spec.name)


def vllm_constraints(so: StructuredOutputs, prefix: str) -> list[tuple[str, Constraint]]:
    """vLLM's constraint fields that are set, each as (request field, Constraint)."""
    out = []
    if so.structural_tag is not None:
        param = f"{prefix}structural_tag"
        tag = json_value(so.structural_tag, param)
        out.append((param, at(param, lambda: Constraint.from_structural_tag(tag))))
    if so.json_ is not None:
        param = f"{prefix}json"
        out.append((param, schema_constraint(json_value(so.json_, param), param)))
    if so.json_object:
        out.append((f"{prefix}json_object", Constraint.any_json()))
    if so.regex is not None:
        out.append((f"{prefix}regex", at(f"{prefix}regex",
                                         lambda: Constraint.from_regex(so.regex or ""))))
    if so.choice is not None:
        out.append((f"{prefix}choice", at(f"{prefix}choice",
                                          lambda: Constraint.one_of(so.choice or []))))
    if so.grammar is not None:
        out.append((f"{prefix}grammar", at(f"{prefix}grammar",
                                           lambda: Constraint.from_grammar(so.grammar or ""))))
    return out


def json_value(schema: dict[str, Any] | str, param: str) -> Any:
    """A schema (or structural tag) given as an object or (vLLM allows it) as JSON text."""
    if isinstance(schema, dict):
        return schema
    try:
        return json.loads(schema)
    except (ValueError, RecursionError):
        raise InvalidRequestError("a JSON schema given as a string must be JSON text",
                                  param=param) from None


# -- tools ------------------------------------------------------------------------------

def engine_tools(tools: list[ChatTool]) -> list[Tool]:
    """The request's tools as the engine's envelope describes them, each tool's schema
    checked (a bad one is a 400 naming it)."""
    for i, t in enumerate(tools):
        schema_constraint(t.function.parameters or EMPTY_OBJECT,
                          f"tools[{i}].function.parameters")
    return [Tool(t.function.name, t.function.description or "",
                 t.function.parameters or EMPTY_OBJECT) for t in tools]


@dataclass(frozen=True)
class ToolTurn:
    """What a turn that may or must call a tool asks: the reply, the constraint, the
    system text and, for "auto" and "required", the worked exchange shown after it;
    for native calls only the tools the chat template renders."""

    reply: Reply
    constraint: Constraint | None
    prompt: str | None
    example: tuple[Message, ...] = ()
    tools: tuple[Tool, ...] = ()


def tool_constraint(req: ChatCompletionRequest, text: Constraint | None = None,
                    native: bool = False) -> ToolTurn | None:
    """For a turn that may or must call a tool: the reply, the constraint, the prompt.

    None when no tool is to be called (no tools, or ``tool_choice: "none"``).
    ``"auto"`` (the default when tools are given) lets the model choose text (in the
    shape ``text`` asks for, if any) or calls; ``"required"`` asks for one or more
    calls, and a named function for that function's arguments only.
    """
    choice, tools = req.tool_choice, req.tools
    if choice == "none" or (choice is None and not tools):
        return None
    if not tools:
        raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
    if native and choice in (None, "auto"):
        return ToolTurn(Reply("native"), None, None, tools=tuple(engine_tools(tools)))
    if choice is None or choice in ("auto", "required"):
        required = choice == "required"
        max_calls = 1 if req.parallel_tool_calls is False else DEFAULT_MAX_CALLS
        shape = as_format(text) if text is not None and not required else None
        found = engine_tools(tools)
        constraint = envelope_constraint(found, required=required, max_calls=max_calls,
                                         text=shape)
        return ToolTurn(Reply("required" if required else "auto"), constraint,
                        tools_instructions(found, required=required),
                        shown_exchange(demonstration(found)))
    name = choice.function.name
    index = next((i for i, t in enumerate(tools) if t.function.name == name), None)
    if index is None:
        known = ", ".join(t.function.name for t in tools)
        raise InvalidRequestError(f"tool_choice names function {name!r}, which is not "
                                  f"in tools (known: {known})", param="tool_choice")
    params = tools[index].function.parameters or EMPTY_OBJECT
    constraint = schema_constraint(params, f"tools[{index}].function.parameters", name)
    return ToolTurn(Reply("named", name), constraint, named_prompt(tools, name))


def named_prompt(tools: list[ChatTool], named: str) -> str:
    """The system text for a named call: the tools, then the one to call now."""
    listing = tools_instructions(engine_tools(tools), required=True).splitlines()
    return "\n".join([*listing[:-2], f"Call the function {named} now: reply with its "
                      "arguments only, as one JSON object."])


def content_text(m: ChatMessage) -> str:
    """A message's own text (its text parts joined)."""
    if isinstance(m.content, list):
        return "".join(p.text or "" for p in m.content if p.type == "text")
    return m.content or ""


def message_text(m: ChatMessage, names: dict[str, str]) -> str:
    """A message's text, with earlier tool calls and tool results written out.

    ``names`` maps the tool call ids seen so far to their function names; the
    caller passes it through the conversation in order.
    """
    text = content_text(m)
    if m.role == "assistant" and m.tool_calls:
        calls = []
        for call in m.tool_calls:
            names[call.id] = call.function.name
            calls.append(render_call(call.function.name, call.function.arguments))
        return "\n".join(([text] if text else []) + calls)
    if m.role == "tool":
        name = names.get(m.tool_call_id or "", m.name or "")
        return f"<tool_response name={json.dumps(name)}>\n{text}\n</tool_response>"
    return text


# -- logprobs ---------------------------------------------------------------------------

def logprob_fields(req: ChatCompletionRequest | CompletionRequest) -> tuple[bool, int]:
    """(report logprobs?, alternatives per token) from the request's logprob fields."""
    if isinstance(req, CompletionRequest):
        return req.logprobs is not None, req.logprobs or 0
    if req.top_logprobs is not None and not req.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs set to true",
                                  param="top_logprobs")
    return bool(req.logprobs), req.top_logprobs or 0


def shown_exchange(exchange: Exchange) -> tuple[Message, ...]:
    """The worked exchange as the user and assistant turns the prompt shows."""
    return (Message(role="user", content=exchange.request),
            Message(role="assistant", content=exchange.reply))
