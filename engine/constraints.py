"""Constrained generation: the one way to ask a backend for structured output.

A ``Constraint`` says what shape a sample must have: a JSON schema (or any
JSON object), a regular expression, one of a few strings, or a grammar
(EBNF/Lark, as vLLM's structured outputs take it). It rides on
``SamplingParams.constraint``; each backend maps it to its engine
(``VLLMBackend`` to vLLM's structured outputs, ``OpenAIBackend`` to
``response_format`` or a vLLM server's structured-output fields). A backend
that cannot honour a kind raises ``UnsupportedConstraintError`` naming the
kind and the backend: a constrained request never gets a silent free-text
answer.

The constructors validate up front (a schema that is not a schema, a regex
that does not compile), so bad input is a 400 before any engine call.

Example:
    >>> from pydantic import BaseModel
    >>> class Grade(BaseModel):
    ...     score: int
    >>> c = Constraint.from_schema(Grade)
    >>> c.kind, c.accepts('{"score": 3}'), c.accepts('three')
    ('json', True, False)
    >>> Constraint.one_of(["yes", "no"]).accepts("no")
    True
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from refinery.engine.errors import InvalidRequestError

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
ALL_KINDS: frozenset[str] = frozenset(("json", "json_object", "regex", "choice", "grammar",
                                       "structural_tag"))


class UnsupportedConstraintError(InvalidRequestError):
    """The backend cannot enforce this kind of constraint (400, code ``unsupported_constraint``)."""

    def __init__(self, kind: str, backend: str, supported: frozenset[str] | set[str]):
        allowed = ", ".join(sorted(supported)) or "none"
        super().__init__(f"the {backend} backend cannot enforce a {kind!r} constraint "
                         f"(it supports: {allowed})", code="unsupported_constraint")
        self.kind = kind


class Constraint(BaseModel):
    """What shape every sample of a call must have; exactly one field is set.

    Build it with ``Constraint.from_schema``, ``.any_json()``, ``.from_regex``,
    ``.one_of`` or ``.from_grammar``, which validate their argument.
    """

    model_config = ConfigDict(frozen=True)

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = Field(None, description="a regular expression the whole sample matches")
    choice: tuple[str, ...] | None = None
    grammar: str | None = Field(None, description="an EBNF/Lark grammar, vLLM's syntax")
    structural_tag: dict[str, Any] | None = Field(
        None, description="an xgrammar structural tag, as vLLM's structured_outputs take it")
    # The name a response_format json_schema carried (OpenAI requires one upstream).
    name: str = "output"

    @model_validator(mode="after")
    def _exactly_one(self) -> Constraint:
        given = [self.json_schema is not None, self.json_object, self.regex is not None,
                 self.choice is not None, self.grammar is not None,
                 self.structural_tag is not None]
        if sum(given) != 1:
            raise ValueError("a constraint sets exactly one of json_schema, json_object, "
                             "regex, choice, grammar, structural_tag")
        return self

    # -- constructors -------------------------------------------------------------------

    @classmethod
    def from_schema(cls, schema: dict[str, Any] | type[BaseModel], *, name: str | None = None
                    ) -> Constraint:
        """Samples are JSON valid under ``schema`` (a JSON Schema dict or a pydantic model)."""
        if isinstance(schema, type) and issubclass(schema, BaseModel):
            name = name or schema.__name__
            schema = schema.model_json_schema()
        if not isinstance(schema, dict):
            raise InvalidRequestError("a JSON schema must be an object", param="json_schema")
        check_schema(schema)
        return cls(json_schema=schema, name=name or "output")

    @classmethod
    def any_json(cls) -> Constraint:
        """Samples are one JSON object, any keys (OpenAI's ``json_object`` mode)."""
        return cls(json_object=True)

    @classmethod
    def from_regex(cls, pattern: str) -> Constraint:
        """Samples match ``pattern`` in full."""
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise InvalidRequestError(f"invalid regex {pattern!r}: {exc}",
                                      param="regex") from None
        return cls(regex=pattern)

    @classmethod
    def one_of(cls, options: list[str] | tuple[str, ...]) -> Constraint:
        """Samples are exactly one of ``options``."""
        opts = tuple(options)
        if not opts or not all(isinstance(o, str) and o for o in opts):
            raise InvalidRequestError("a choice constraint needs one or more non-empty "
                                      "strings", param="choice")
        return cls(choice=opts)

    @classmethod
    def from_grammar(cls, text: str) -> Constraint:
        """Samples are sentences of ``text``, an EBNF/Lark grammar (vLLM's syntax)."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequestError("a grammar must be a non-empty string", param="grammar")
        return cls(grammar=text)

    @classmethod
    def from_structural_tag(cls, tag: dict[str, Any], *, name: str = "output",
                            check: bool = True) -> Constraint:
        """Samples follow ``tag``, an xgrammar structural tag (``{"type": "structural_tag",
        "format": ...}``): free text and constrained regions in one grammar, as the
        tool-call envelope (``engine.tool_calls``) needs. With ``check``, compiled by
        xgrammar where it is installed (with vLLM), so a tag it refuses is a 400 before
        any engine call; a caller that built the tag from checked parts passes False
        (importing xgrammar costs seconds where no engine has imported it yet)."""
        if not isinstance(tag, dict) or tag.get("type") != "structural_tag":
            raise InvalidRequestError("a structural tag is an object of type "
                                      "'structural_tag'", param="structural_tag")
        if check:
            _check_structural_tag(tag)
        return cls(structural_tag=tag, name=name)

    # -- reading ------------------------------------------------------------------------

    @property
    def kind(self) -> ConstraintKind:
        if self.json_schema is not None:
            return "json"
        if self.json_object:
            return "json_object"
        if self.regex is not None:
            return "regex"
        if self.choice is not None:
            return "choice"
        if self.structural_tag is not None:
            return "structural_tag"
        return "grammar"

    @property
    def max_chars(self) -> int | None:
        """The longest text the constraint allows, when it is bounded.

        A token writes at least one character, so ``max_chars + 1`` tokens (the
        last one the end of the sample) always fit a constrained sample whole.
        Exact for a regex or a choice. For a JSON schema whose every string,
        array and object is bounded, it is the length of the longest compact
        document, an escaped character counted as one: JSON also allows
        whitespace between tokens, which the bound leaves out.
        """
        if self.choice is not None:
            return max(len(c) for c in self.choice)
        if self.json_schema is not None:
            return _json_max_chars(self.json_schema)
        if self.regex is None:
            return None
        try:
            from re import _parser  # the stdlib's own regex parser (3.11+)
        except ImportError:  # Python 3.10
            import sre_parse as _parser

        try:
            _, high = _parser.parse(self.regex).getwidth()
        except (re.error, OverflowError):
            return None
        return None if high >= _parser.MAXREPEAT else high

    def accepts(self, text: str) -> bool:
        """Whether ``text`` satisfies the constraint (grammars and structural tags: not
        checked, True).

        Used to count parse rates and by tests; backends enforce, this only reads.
        """
        if self.regex is not None:
            return re.fullmatch(self.regex, text, re.S) is not None
        if self.choice is not None:
            return text in self.choice
        if self.grammar is not None or self.structural_tag is not None:
            return True
        try:
            value = json.loads(text)
        except ValueError:
            return False
        if self.json_object:
            return isinstance(value, dict)
        import jsonschema

        return jsonschema.Draft202012Validator(self.json_schema).is_valid(value)


def _json_max_chars(schema: dict[str, Any]) -> int | None:
    """The longest compact JSON ``schema`` allows, or None when anything in it is unbounded
    (a string without ``maxLength``, an array without ``maxItems``, an open object,
    a number without both limits)."""
    if not isinstance(schema, dict):
        return None  # a list of item schemas (tuple validation): not sized here
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return max(len(json.dumps(v, separators=(",", ":"))) for v in values)
    kind = schema.get("type")
    if kind == "string":
        return 2 + schema["maxLength"] if "maxLength" in schema else None
    if kind == "boolean":
        return 5
    if kind == "null":
        return 4
    if kind == "integer" and "minimum" in schema and "maximum" in schema:
        return max(len(str(int(schema["minimum"]))), len(str(int(schema["maximum"]))))
    if kind == "array" and "maxItems" in schema and "items" in schema:
        item = _json_max_chars(schema["items"])
        n = schema["maxItems"]
        return None if item is None else 2 + n * item + max(n - 1, 0)
    if kind == "object" and schema.get("additionalProperties") is False:
        sizes = [(len(json.dumps(key)), _json_max_chars(sub))
                 for key, sub in schema.get("properties", {}).items()]
        if any(size is None for _, size in sizes):
            return None
        # each member is "key":value, members comma-separated, all in braces
        return 2 + sum(k + 1 + v for k, v in sizes) + max(len(sizes) - 1, 0)
    return None


def require_support(constraint: Constraint | None, supported: frozenset[str],
                    backend: str) -> None:
    """Raise ``UnsupportedConstraintError`` unless ``constraint`` is None or supported."""
    if constraint is not None and constraint.kind not in supported:
        raise UnsupportedConstraintError(constraint.kind, backend, supported)


def _check_structural_tag(tag: dict[str, Any]) -> None:
    try:
        import xgrammar
    except ImportError:  # no local engine: the upstream server checks it
        return
    try:
        xgrammar.Grammar.from_structural_tag(json.dumps(tag))
    except Exception as exc:  # xgrammar raises several types for a tag it cannot compile
        raise InvalidRequestError(f"invalid structural tag: {exc}",
                                  param="structural_tag") from None


def check_schema(schema: dict[str, Any]) -> None:
    """Raise ``InvalidRequestError`` unless ``schema`` is a valid JSON Schema."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise InvalidRequestError(f"invalid JSON schema at {where}: {exc.message}",
                                  param="json_schema") from None


class StructuredModeError(UnsupportedConstraintError):
    """``structured=True`` asked of a strategy (or verifier) whose backend cannot enforce
    the constraint kinds its parsed steps need (400, code ``unsupported_constraint``)."""

    def __init__(self, who: str, missing: list[str], backend: str,
                 supported: frozenset[str] | set[str]):
        allowed = ", ".join(sorted(supported)) or "none"
        kinds = " and ".join(repr(k) for k in missing)
        InvalidRequestError.__init__(
            self, f"{who}(structured=True) needs {kinds} constraints, which the {backend} "
            f"backend cannot enforce (it supports: {allowed}); use {who}(structured=False) "
            "for the free-text path", param="structured", code="unsupported_constraint")
        self.kind = missing[0]
        self.missing = tuple(missing)
        self.who = who


def structured_mode(who: str, wanted: bool | None, kinds: frozenset[str],
                    backend: object) -> bool:
    """Whether ``who``'s parsed steps ask the backend for constrained output.

    The one place this is decided, for every strategy and the judge verifier.
    ``wanted`` is their ``structured`` parameter: ``False`` keeps the free-text
    path; ``None`` (the default) constrains when the backend enforces every kind
    in ``kinds``, else keeps free text; ``True`` constrains, and a backend that
    cannot is an error naming what is missing, never a silent fallback. A
    backend without ``structured_outputs`` supports no kind.

    Raises:
        StructuredModeError: ``wanted`` is True and a kind in ``kinds`` is unsupported.
    """
    if wanted is False or not kinds:
        return False
    supported = frozenset(getattr(backend, "structured_outputs", None) or ())
    missing = sorted(kinds - supported)
    if not missing:
        return True
    if wanted is None:
        return False
    raise StructuredModeError(who, missing, type(backend).__name__, supported)
