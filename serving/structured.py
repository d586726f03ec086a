"""What a request asks of its output's shape: a constraint, logprobs, a forced tool call.

``output_of(request)`` reads, validates and reconciles the fields that shape
an answer, before any engine call (a bad schema or regex is a 400 naming the
field):

- ``response_format`` (``text``, ``json_object``, ``json_schema``; ``strict``
  is accepted and the schema is always enforced), vLLM's ``structured_outputs``
  (``json``, ``regex``, ``choice``, ``grammar``, ``json_object``) and its older
  ``guided_json``/``guided_regex``/``guided_choice``/``guided_grammar``. At most
  one constraint per request; a named or required ``tool_choice`` is one too.
- ``tools`` with ``tool_choice``: a named function's arguments are generated
  under its ``parameters`` schema; ``"required"`` generates a JSON array of
  ``{"name", "parameters"}`` calls over all tools (vLLM's schema); ``"none"``
  ignores the tools; ``"auto"`` (the default when tools are given) is refused:
  the server has no tool-call parser to find calls in free text.
- ``logprobs``/``top_logprobs`` (chat) or ``logprobs: k`` (completions).

The tools are described to the model in a system turn (``tools_prompt``), as a
chat template that takes tools would; earlier tool calls and tool results in
the conversation are rendered as text (``message_text``).

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
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ChatTool,
    CompletionRequest,
    ResponseFormat,
    StructuredOutputs,
)

EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
MAX_SCHEMA_DEPTH = 64  # deeper schemas are refused, not handed to recursive checkers
NO_PARSER = ("tool_choice 'auto' (the default when tools are given) needs a tool-call "
             "parser, which this server does not have for its model: name the function "
             "(tool_choice={'type': 'function', 'function': {'name': ...}}), ask for "
             "'required', or send 'none'")


@dataclass(frozen=True)
class Reply:
    """How a choice's text becomes the response: text, or tool calls; with logprobs?"""

    tools: Literal["none", "named", "required"] = "none"
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


def output_of(req: ChatCompletionRequest | CompletionRequest) -> Output:
    """The output shape ``req`` asks for.

    Raises:
        InvalidRequestError: a bad schema or regex, two constraints, a tool
            choice that cannot be served, logprob fields OpenAI refuses.
    """
    found = format_constraints(req)
    reply, prompt = Reply(), None
    if isinstance(req, ChatCompletionRequest):
        tool = tool_constraint(req)
        if tool is not None:
            reply, constraint, prompt = tool
            found.append(("tool_choice", constraint))
    if len(found) > 1:
        raise InvalidRequestError(
            "only one output constraint per request; got " + ", ".join(p for p, _ in found),
            param=found[1][0])
    logprobs, top = logprob_fields(req)
    constraint = found[0][1] if found else None
    return Output(constraint=constraint, logprobs=logprobs, top_logprobs=top,
                  reply=Reply(reply.tools, reply.function, logprobs), tools_prompt=prompt)


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
    if so.structural_tag is not None:
        raise InvalidRequestError("structural_tag constraints are not supported here",
                                  param=f"{prefix}structural_tag")
    out = []
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
    """A schema given as an object or (vLLM allows it) as JSON text."""
    if isinstance(schema, dict):
        return schema
    try:
        return json.loads(schema)
    except (ValueError, RecursionError):
        raise InvalidRequestError("a JSON schema given as a string must be JSON text",
                                  param=param) from None


# -- tools ------------------------------------------------------------------------------

def tool_constraint(req: ChatCompletionRequest) -> tuple[Reply, Constraint, str] | None:
    """For a named or required ``tool_choice``: the reply, the constraint and the prompt.

    None when no tool is to be called (no tools, or ``tool_choice: "none"``).
    """
    choice, tools = req.tool_choice, req.tools
    if choice == "none" or (choice is None and not tools):
        return None
    if not tools:
        raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
    if choice is None or choice == "auto":
        raise InvalidRequestError(NO_PARSER, param="tool_choice")
    if choice == "required":
        schema = required_schema(tools, req.parallel_tool_calls)
        return (Reply("required"), schema_constraint(schema, "tools"),
                tools_prompt(tools, None))
    name = choice.function.name
    index = next((i for i, t in enumerate(tools) if t.function.name == name), None)
    if index is None:
        known = ", ".join(t.function.name for t in tools)
        raise InvalidRequestError(f"tool_choice names function {name!r}, which is not "
                                  f"in tools (known: {known})", param="tool_choice")
    params = tools[index].function.parameters or EMPTY_OBJECT
    constraint = schema_constraint(params, f"tools.{index}.function.parameters", name)
    return Reply("named", name), constraint, tools_prompt(tools, name)


def required_schema(tools: list[ChatTool], parallel: bool | None) -> dict[str, Any]:
    """vLLM's schema for ``tool_choice: "required"``: an array of one or more calls."""
    calls = [{"properties": {"name": {"type": "string", "enum": [t.function.name]},
                             "parameters": t.function.parameters or EMPTY_OBJECT},
              "required": ["name", "parameters"]} for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": calls}}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


def tools_prompt(tools: list[ChatTool], named: str | None) -> str:
    """The system text that tells the model the tools and what to reply."""
    lines = ["You can call these functions (arguments as a JSON schema):"]
    for t in tools:
        f = t.function
        about = f": {f.description}" if f.description else ""
        lines.append(f"- {f.name}{about}\n  arguments: "
                     + json.dumps(f.parameters or EMPTY_OBJECT, ensure_ascii=False))
    if named is not None:
        lines.append(f"Call the function {named} now: reply with its arguments only, "
                     "as one JSON object.")
    else:
        lines.append('Call one or more of them now: reply with a JSON array of '
                     '{"name": ..., "parameters": {...}} objects only.')
    return "\n".join(lines)


def message_text(m: ChatMessage, names: dict[str, str]) -> str:
    """A message's text, with earlier tool calls and tool results written out.

    ``names`` maps the tool call ids seen so far to their function names; the
    caller passes it through the conversation in order.
    """
    if isinstance(m.content, list):
        text = "".join(p.text or "" for p in m.content if p.type == "text")
    else:
        text = m.content or ""
    if m.role == "assistant" and m.tool_calls:
        calls = []
        for call in m.tool_calls:
            names[call.id] = call.function.name
            calls.append(f'<tool_call>{{"name": {json.dumps(call.function.name)}, '
                         f'"arguments": {call.function.arguments}}}</tool_call>')
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
