"""``Constraint.max_chars``: the longest text a constraint allows, which sizes a
parsed step's token cap so a constrained sample can always close."""

from __future__ import annotations

import json

import pytest

from refinery.engine.constraints import Constraint
from refinery.strategies.sage import plan_schema
from refinery.strategies.socratic import decomposition_schema


def longest(schema: dict):
    """A document that fills every bound of ``schema`` (the shapes used here)."""
    if "enum" in schema:
        return max(schema["enum"], key=lambda v: len(json.dumps(v)))
    kind = schema["type"]
    if kind == "string":
        return "x" * schema["maxLength"]
    if kind == "integer":
        return schema["minimum"] if len(str(schema["minimum"])) > len(str(schema["maximum"])) \
            else schema["maximum"]
    if kind == "boolean":
        return False
    if kind == "array":
        return [longest(schema["items"])] * schema["maxItems"]
    return {k: longest(v) for k, v in schema["properties"].items()}


@pytest.mark.parametrize("constraint", [
    plan_schema(300), plan_schema(64), decomposition_schema(8), decomposition_schema(1),
    Constraint.from_schema({"type": "object", "additionalProperties": False, "properties": {
        "grade": {"type": "integer", "minimum": -10, "maximum": 5},
        "ok": {"type": "boolean"}, "tag": {"enum": ["a", "bbb", None]}}}),
], ids=["plan-300", "plan-64", "decomposition-8", "decomposition-1", "scalars"])
def test_a_bounded_schema_gives_the_length_of_its_longest_compact_document(constraint):
    doc = json.dumps(longest(constraint.json_schema), separators=(",", ":"))
    assert constraint.accepts(doc)
    assert constraint.max_chars == len(doc)


@pytest.mark.parametrize("schema", [
    {"type": "string"},
    {"type": "array", "items": {"type": "string", "maxLength": 3}},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}},  # open
    {"type": "object", "additionalProperties": False,
     "properties": {"a": {"type": "string"}}},
    {"type": "integer", "minimum": 0},
    {"type": "number", "minimum": 0, "maximum": 1},  # digits after the point: unbounded
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",  # tuple form
     "maxItems": 2, "items": [{"type": "boolean"}]},
    {"type": "array", "maxItems": 2, "prefixItems": [{"type": "boolean"}]},
])
def test_anything_unbounded_gives_none(schema):
    assert Constraint.from_schema(schema).max_chars is None


def test_any_json_object_is_unbounded():
    assert Constraint.any_json().max_chars is None
