"""A strategy spec checked as the user types: errors, a did-you-mean, worst case, graph.

The check is the server's own (``build_with_graph`` with the server's call cap), so
a spec the page accepts is one a request may send. The did-you-mean is computed
here from the parsed spec (names against the registry, keywords against each
strategy's parameters), never read out of an error message.

Example:
    >>> check_spec("sc(cott)").suggestion.model_dump()
    {'kind': 'strategy', 'wrong': 'cott', 'suggestion': 'cot'}
    >>> check_spec("sc(cot, n=4)").worst_case_calls
    1
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, Field

from refinery.engine.errors import RefineryError
from refinery.strategies.registry import REGISTRY, build_with_graph
from refinery.strategies.spec import DEFAULT_MAX_CALLS, children, non_default, parse_spec, to_spec


class Suggestion(BaseModel):
    """A close registered name for an unknown strategy or parameter."""

    kind: Literal["strategy", "parameter"]
    wrong: str
    suggestion: str


class SpecNode(BaseModel):
    """One strategy of a validated spec: its name, non-default parameters, worst case."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)
    calls: int
    inner: list[SpecNode] = Field(default_factory=list)


class SpecProblem(BaseModel):
    """Why a spec is refused, as the API would say it."""

    message: str
    type: str
    param: str | None = None


class SpecCheck(BaseModel):
    """The answer of ``/ui/api/spec``: ``ok`` with the canonical spec, worst case and
    graph, or the error (and a did-you-mean when a name is close to a known one)."""

    ok: bool
    spec: str
    preset: str | None = Field(None, description="the preset ``spec`` names, if it is one")
    canonical: str | None = None
    worst_case_calls: int | None = None
    graph: SpecNode | None = None
    error: SpecProblem | None = None
    suggestion: Suggestion | None = None


def check_spec(spec: str, max_calls: int | None = DEFAULT_MAX_CALLS,
               presets: Mapping[str, str] | None = None) -> SpecCheck:
    """Validate ``spec`` as the server would: a preset's name is its spec, and
    ``max_calls`` is the server's cap on the worst case."""
    preset = spec.strip() if presets and spec.strip() in presets else None
    resolved = presets[preset] if preset is not None and presets else spec
    try:
        _, g = build_with_graph(resolved, max_calls=max_calls)
    except RefineryError as exc:
        return SpecCheck(ok=False, spec=spec, preset=preset, suggestion=suggest(resolved),
                         error=SpecProblem(message=exc.message, type=exc.type,
                                           param=exc.param))
    return SpecCheck(ok=True, spec=spec, preset=preset, canonical=to_spec(g),
                     worst_case_calls=g.graph["worst_case_calls"], graph=spec_node(g))


def spec_node(g: nx.DiGraph, nid: str | None = None) -> SpecNode:
    """The validated graph as a tree (inner strategies in spec order)."""
    nid = g.graph["root"] if nid is None else nid
    data = g.nodes[nid]
    return SpecNode(name=data["name"], params=non_default(data["params"]), calls=data["calls"],
                    inner=[spec_node(g, k) for k in children(g, nid)])


def suggest(spec: str) -> Suggestion | None:
    """The first unknown name in ``spec`` that is close to a known one (None: none is)."""
    try:
        g = parse_spec(spec)
    except RefineryError:
        return None  # does not parse: nothing to compare
    for nid in nx.topological_sort(g):
        data = g.nodes[nid]
        cls = REGISTRY.get(data["name"])
        if cls is None:
            close = difflib.get_close_matches(data["name"], list(REGISTRY), n=1, cutoff=0.5)
            return _suggestion("strategy", data["name"], close)
        fields = list(cls.Params.model_fields)
        for key in data["kwargs"]:
            if key not in fields:
                return _suggestion("parameter", key, difflib.get_close_matches(key, fields, n=1))
    return None


def _suggestion(kind: Literal["strategy", "parameter"], wrong: str,
                close: list[str]) -> Suggestion | None:
    return Suggestion(kind=kind, wrong=wrong, suggestion=close[0]) if close else None
