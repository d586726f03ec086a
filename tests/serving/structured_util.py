"""Helpers of the structured-output server tests: a double that answers in the shape
its call's constraint asks for (the scripted double does not enforce constraints)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from refinery.engine.types import Message, SamplingParams
from tests.scripted_backend import ScriptedBackend

SOLUTION = "2 + 2 = 4, so the answer is \\boxed{4}"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"], "additionalProperties": False}
JSON_ANSWER = '{"answer": 4}'
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def shaped(json_text: str = JSON_ANSWER, tagged: str | list[str] = CALL):
    """A reply rule: free text unconstrained, else a text of the constraint's shape
    (``tagged`` for a structural tag: a tool-call envelope by default; a list gives
    sample i item i)."""
    def reply(messages: Sequence[Message], params: SamplingParams, i: int) -> str:
        c = params.constraint
        if c is None:
            return SOLUTION
        if c.kind == "structural_tag":
            return tagged if isinstance(tagged, str) else tagged[i % len(tagged)]
        return {"json": json_text, "json_object": '{"a": 1}', "regex": "42",
                "grammar": "yes"}.get(c.kind) or (c.choice or ("",))[0]
    return reply


def shaped_backend(json_text: str = JSON_ANSWER, tagged: str | list[str] = CALL,
                   **knobs: Any) -> ScriptedBackend:
    return ScriptedBackend([(r".*", shaped(json_text, tagged))], **knobs)


def constraints(backend: ScriptedBackend) -> list[Any]:
    """The constraint of every call the backend got, in order."""
    return [c.params.constraint for c in backend.calls]


def as_json(text: str) -> Any:
    return json.loads(text)
