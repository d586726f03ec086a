"""Tolerant parsers for model output: tags and JSON.

Scores are parsed by ``refinery.verifiers.judge.parse_score``.

Small models write garbage: every parser here returns ``None`` (or raises
``ValueError`` with a message worth showing the model, for JSON) instead of
failing the task; callers record the fallback they use.

Example:
    >>> tag("so <answer> 12 </answer>", "answer")
    '12'
"""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)


def tag(text: str, name: str) -> str | None:
    """Content of the last ``<name>...</name>``; an unclosed last tag runs to the end."""
    closed = re.findall(rf"<{name}>(.*?)</{name}>", text, re.S | re.I)
    if closed:
        return closed[-1].strip()
    opened = re.split(rf"<{name}>", text, flags=re.I)
    if len(opened) > 1 and opened[-1].strip():
        return opened[-1].strip()
    return None


def after(text: str, marker: str) -> str | None:
    """Text after the last ``marker`` (case-insensitive), or None if absent."""
    idx = text.lower().rfind(marker.lower())
    return None if idx < 0 else text[idx + len(marker):].strip()


def parse_json_object(text: str) -> Any:
    """The JSON value in a reply: code fences and chatter around it are dropped,
    trailing commas repaired.

    Raises:
        ValueError: no parseable JSON (the message says why, to show the model).
    """
    fenced = _FENCE.findall(text)
    body = fenced[-1] if fenced else text
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object found in the reply")
    start = min(starts)
    end = max(body.rfind("}"), body.rfind("]"))
    if end <= start:
        raise ValueError("the JSON object is not closed")
    snippet = re.sub(r",\s*([}\]])", r"\1", body[start:end + 1])
    try:
        return json.loads(snippet)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")\
            from None
