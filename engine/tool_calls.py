"""Tool calls in a model's text: one envelope, the constraint that lets the model choose
it, the parser that reads it back, and the canonical form votes compare.

A model with no tool-call format of its own (its chat template knows no tools, it has
no parser) is shown the tools and this envelope in its prompt, one call per tag::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

and generates under a structural tag (vLLM's ``structural_tag``, compiled by
xgrammar) that admits exactly two shapes: free text that never opens the envelope,
or one or more envelopes whose ``name`` is a given tool's and whose ``arguments``
follow that tool's JSON schema. The answer is then text or calls, never half of each.
``tool_choice: "required"`` closes the text branch. ``max_calls`` bounds the calls
of one answer (1 when parallel calls are off), so a model that repeats a call stops
at the bound instead of running to ``max_tokens``.

``parse_calls`` reads an answer back: its calls, de-duplicated (a repeated identical
call is the same call), and whether the last envelope was cut off. ``call_key`` is
the canonical form of a call (name plus arguments as compact, key-sorted JSON with
integral floats written as integers), the key a vote groups equal calls by, however
each was written.

Example:
    >>> tools = [Tool("add", parameters={"type": "object",
    ...                                  "properties": {"a": {"type": "number"}}})]
    >>> turn = parse_calls('<tool_call>{"name": "add", "arguments": {"a": 2.0}}</tool_call>')
    >>> [call_key(c) for c in turn.calls], turn.cut
    (['add{"a":2}'], False)
    >>> parse_calls("It is sunny.").calls
    []
    >>> envelope_constraint(tools, required=False).kind
    'structural_tag'
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from refinery.engine.constraints import Constraint, check_schema

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
DEFAULT_MAX_CALLS = 8
KEY_PREFIX = "tool_call: "  # what starts a tool-call answer's vote key (``turn_key``)


@dataclass(frozen=True)
class Tool:
    """A function the model may call: its name, what it does, its arguments' schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_OBJECT))


@dataclass(frozen=True)
class Call:
    """One tool call read from an answer: the function's name and its arguments."""

    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text, as the OpenAI API carries them."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class CallDelta:
    """A streamed piece of a native tool call, as vLLM's server streams them: the
    call's ``index`` in the answer, its ``name`` (on the call's first piece only) and
    a fragment of its ``arguments`` JSON text (the fragments concatenate to it)."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class CallTurn:
    """What an answer holds: its calls (empty: a text answer), and whether an envelope
    was cut off before it closed (its partial call is dropped, never shown as text)."""

    calls: list[Call]
    cut: bool = False


def _tag(tool: Tool) -> dict[str, Any]:
    return {"type": "tag", "begin": f'{OPEN}{{"name": {json.dumps(tool.name)}, "arguments": ',
            # one blank at most between JSON tokens: a small model otherwise pads the
            # arguments with whitespace until max_tokens
            "content": {"type": "json_schema", "json_schema": tool.parameters or EMPTY_OBJECT,
                        "max_whitespace_cnt": 1},
            "end": "}" + CLOSE}


def envelope_constraint(tools: Sequence[Tool], *, required: bool,
                        max_calls: int = DEFAULT_MAX_CALLS,
                        text: dict[str, Any] | None = None) -> Constraint:
    """The structural tag for a turn that may (``required=False``) or must call a tool.

    ``text`` is the shape the text branch must have (a structural-tag format such as
    ``{"type": "json_schema", ...}``, for a response format on the same request);
    None: any text that does not open the envelope.

    Raises:
        InvalidRequestError: a tool's ``parameters`` is not a JSON schema.
    """
    for t in tools:
        check_schema(t.parameters or EMPTY_OBJECT)
    calls: dict[str, Any] = {"type": "repeat", "min": 1, "max": max(1, max_calls),
                             "content": {"type": "or", "elements": [_tag(t) for t in tools]}}
    if required:
        shape = calls
    else:
        free = text or {"type": "any_text", "excludes": [OPEN]}
        shape = {"type": "or", "elements": [free, calls]}
    # Built from checked schemas, so not compiled here (the engine compiles it anyway).
    return Constraint.from_structural_tag({"type": "structural_tag", "format": shape},
                                          name="tool_calls", check=False)


def tools_instructions(tools: Sequence[Tool], *, required: bool) -> str:
    """The system text that shows the model the tools and the envelope."""
    lines = ["You can call these functions (arguments as a JSON schema):"]
    for t in tools:
        about = f": {t.description}" if t.description else ""
        lines.append(f"- {t.name}{about}\n  arguments: "
                     + json.dumps(t.parameters or EMPTY_OBJECT, ensure_ascii=False))
    lines.append(f"To call a function, reply with {OPEN}{{\"name\": ..., \"arguments\": "
                 f"{{...}}}}{CLOSE}, one tag per call and nothing else.")
    if required:
        lines.append("Call one or more of them now.")
    else:
        lines.append("If no function is needed, answer in plain text instead.")
    return "\n".join(lines)


@dataclass(frozen=True)
class Exchange:
    """A user's request and the assistant's reply to it, as the text of two turns."""

    request: str
    reply: str


def demonstration(tools: Sequence[Tool]) -> Exchange:
    """One worked exchange that shows the model the envelope: a request the first
    tool answers (its description) and the call to it, with arguments of the right
    types. A small model that never opens the envelope when only told of it copies
    a shown exchange (docs/results.md, Tool calls); the caller sends it as real turns.

    Example:
        >>> shown = demonstration([Tool("add", "Add two numbers.", {
        ...     "type": "object", "properties": {"a": {"type": "number"}}})])
        >>> shown.request, shown.reply
        ('Add two numbers.', '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    """
    tool = tools[0]
    props = (tool.parameters or {}).get("properties", {})
    args = {key: _sample(schema) for key, schema in props.items()}
    return Exchange(request=tool.description or f"Use {tool.name}.",
                    reply=render_call(tool.name, json.dumps(args, ensure_ascii=False)))


def _sample(schema: Any) -> Any:
    """A value of the type ``schema`` names (its first enum value, if it lists any)."""
    if not isinstance(schema, dict):
        return "example"
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    return {"number": 1, "integer": 1, "boolean": True, "array": [], "object": {},
            "null": None}.get(kind, "example")


def render_call(name: str, arguments: str) -> str:
    """An earlier call of the conversation, written in the envelope (``arguments``: JSON)."""
    return f'{OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{CLOSE}'


def parse_calls(text: str) -> CallTurn:
    """The calls of an answer, in order and de-duplicated; a text answer has none."""
    body = text.lstrip()
    if not body.startswith(OPEN):
        return CallTurn(calls=[])
    calls: list[Call] = []
    seen: set[str] = set()
    for chunk in body.split(OPEN)[1:]:
        inner, closed, _ = chunk.partition(CLOSE)
        call = _call(inner) if closed else None
        if call is None:
            return CallTurn(calls=calls, cut=True)
        if (key := call_key(call)) not in seen:
            seen.add(key)
            calls.append(call)
    return CallTurn(calls=calls)


def _call(inner: str) -> Call | None:
    try:
        value = json.loads(inner)
    except (ValueError, RecursionError):
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)
            and isinstance(value.get("arguments", {}), dict)):
        return None
    return Call(value["name"], value.get("arguments", {}))


def canonical_json(value: Any) -> str:
    """``value`` as compact, key-sorted JSON; a float with an integral value as an int.

    Example:
        >>> canonical_json({"b": 1.0, "a": [2.50, "x"]})
        '{"a":[2.5,"x"],"b":1}'
    """
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def call_key(call: Call) -> str:
    """The canonical form of a call: equal calls written differently get one key."""
    return call.name + canonical_json(call.arguments)


def turn_key(text: str) -> str | None:
    """The canonical form of a tool-call answer, its calls' keys in order after
    ``KEY_PREFIX`` (None: a text answer, or a call cut off).

    Example:
        >>> turn_key('<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>')
        'tool_call: f{"x":1}'
    """
    turn = parse_calls(text)
    if not turn.calls or turn.cut:
        return None
    return KEY_PREFIX + "\n".join(call_key(c) for c in turn.calls)


def as_format(c: Constraint) -> dict[str, Any]:
    """``c`` as a structural-tag format, to be the text branch of a tool-call turn.

    Example:
        >>> as_format(Constraint.from_regex("[0-9]+"))
        {'type': 'regex', 'pattern': '[0-9]+'}
    """
    if c.json_schema is not None or c.json_object:
        return {"type": "json_schema", "json_schema": c.json_schema or {"type": "object"}}
    if c.regex is not None:
        return {"type": "regex", "pattern": c.regex}
    if c.choice is not None:
        return {"type": "or", "elements": [{"type": "const_string", "value": v}
                                           for v in c.choice]}
    if c.grammar is not None:
        return {"type": "grammar", "grammar": c.grammar}
    assert c.structural_tag is not None
    return c.structural_tag["format"]
