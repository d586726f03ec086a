"""Strategy specs -> a validated networkx DiGraph -> an instantiated strategy tree.

A spec is a Python-call-shaped string, ``dei(ssr, critique_refine(rounds=2), sage(cot),
votes=5)``, parsed with ``ast.parse(mode="eval")``. Only names, calls, keyword
arguments and literals are allowed: nothing is ever evaluated. A bare name is the
call with defaults; positional arguments are inner strategies, keywords are
parameters. The graph has one node per strategy (``name``, validated ``params``,
worst-case ``calls``) and ordered edges parent -> inner strategy.

The engine does not import ``strategies``: the registry is an argument, any mapping
``name -> entry`` where an entry provides what :class:`StrategyEntry` lists (the
``strategies`` package passes its own).

Example:
    >>> from refinery.strategies.registry import REGISTRY
    >>> strategy, g = build_strategy("sc(cot, n=4)", REGISTRY)
    >>> worst_case_calls(g), to_spec(g)
    (1, 'sc(cot, n=4)')
    >>> print(to_mermaid(g))  # doctest: +SKIP
"""

from __future__ import annotations

import ast
import difflib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_args, get_origin

import networkx as nx
from pydantic import BaseModel, ValidationError

from refinery.engine.errors import BudgetError, SpecError

MAX_SPEC_CHARS = 2000
DEFAULT_MAX_CALLS = 2000
DEFAULT_MAX_DEPTH = 5
DEFAULT_MAX_FANOUT = 8
DEFAULT_MAX_NODES = 64

_SYNTAX_NAMES = {
    "Attribute": "attribute access", "Subscript": "subscripting", "BinOp": "arithmetic",
    "BoolOp": "boolean operators", "Compare": "comparisons", "Lambda": "lambda",
    "IfExp": "conditional expressions", "List": "lists", "Tuple": "tuples", "Dict": "dicts",
    "Set": "sets", "ListComp": "comprehensions", "SetComp": "comprehensions",
    "DictComp": "comprehensions", "GeneratorExp": "generator expressions",
    "Starred": "*args", "JoinedStr": "f-strings", "NamedExpr": "assignment expressions",
    "Await": "await", "Yield": "yield", "YieldFrom": "yield", "UnaryOp": "unary operators",
}


@dataclass(frozen=True)
class ChildCost:
    """An inner strategy as its parent's worst-case function sees it.

    ``one_request``: n attempts of it go out as one request with n samples (a
    ``cot`` variant), so a sampling parent pays ``calls`` once, not n times.
    """

    name: str
    calls: int
    one_request: bool = False


class StrategyEntry(Protocol):
    """What the graph needs to know about one registered strategy."""

    name: str
    params: type[BaseModel]
    min_inner: int
    max_inner: int | None
    default_inner: tuple[str, ...]
    # Optional: ``samples_in_one_request`` (bool, default False), see ChildCost.

    def worst_case(self, params: BaseModel, children: Sequence[ChildCost]) -> int: ...

    def build(self, inner: Sequence[Any], params: BaseModel) -> Any:
        """The strategy of a node :func:`validate` checked: ``params`` is already the
        validated model and ``inner`` the right number of built children."""
        ...


Registry = Mapping[str, StrategyEntry]


# ------------------------------------------------------------------------------- parse


def parse_spec(spec: str) -> nx.DiGraph:
    """Parse a spec string into a raw graph (names as written, parameters unchecked).

    Raises:
        SpecError: the string does not parse or uses syntax other than names,
            calls, keyword arguments and literals.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError("empty strategy spec", param="strategy")
    if len(spec) > MAX_SPEC_CHARS:
        raise SpecError(f"strategy spec longer than {MAX_SPEC_CHARS} characters",
                        param="strategy")
    try:
        tree = ast.parse(spec.strip(), mode="eval")
    except SyntaxError as exc:
        raise SpecError(f"strategy spec does not parse: {exc.msg} (column {exc.offset}) "
                        f"in {_clip(repr(spec))}", param="strategy") from None
    except ValueError as exc:  # UnicodeEncodeError: lone surrogates ('\ud800') in the text
        raise SpecError(f"strategy spec is not valid text: {exc}", param="strategy") from None
    except (RecursionError, MemoryError):  # the parser's own nesting limits
        raise SpecError("strategy spec nests too deeply to parse",
                        param="strategy") from None
    g = nx.DiGraph(spec=spec)
    ids = itertools.count()
    g.graph["root"] = _add(g, tree.body, ids)
    return g


def _add(g: nx.DiGraph, node: ast.expr, ids: itertools.count) -> str:
    if isinstance(node, ast.Name):
        name, args, keywords = node.id, [], []
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name):
            raise _disallowed(node.func, "the called thing must be a strategy name")
        name, args, keywords = node.func.id, node.args, node.keywords
    else:
        raise _disallowed(node, "expected a strategy name or call")
    if name.startswith("_"):
        raise SpecError(f"{name!r} is not a strategy name (names starting with '_' are "
                        "not allowed)", param="strategy")
    nid = f"n{next(ids)}"
    g.add_node(nid, name=name, kwargs={})
    for order, arg in enumerate(args):
        if isinstance(arg, ast.Starred):
            raise _disallowed(arg, f"in the arguments of {name}")
        if _is_literal(arg):
            raise SpecError(f"positional argument {_show(arg)} of {name} must be an "
                            "inner strategy; give parameters by keyword (e.g. n=8)",
                            param="strategy")
        g.add_edge(nid, _add(g, arg, ids), order=order)
    for kw in keywords:
        if kw.arg is None:
            raise SpecError(f"**kwargs is not allowed in a strategy spec (in {name})",
                            param="strategy")
        if kw.arg in g.nodes[nid]["kwargs"]:
            # ast.parse accepts f(n=1, n=2) (only compile rejects it): refuse, don't pick one.
            raise SpecError(f"parameter {kw.arg} of {name} is given more than once",
                            param="strategy")
        g.nodes[nid]["kwargs"][kw.arg] = _literal(kw.value, name, kw.arg)
    return nid


def _is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    return (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float)))


def _literal(node: ast.expr, name: str, key: str) -> Any:
    if not _is_literal(node):
        if isinstance(node, (ast.Name, ast.Call)):
            raise SpecError(f"parameter {key} of {name} must be a literal, not "
                            f"{_show(node)!r} (quote strings: {key}='...')",
                            param="strategy")
        raise _disallowed(node, f"in parameter {key} of {name}")
    # literal_eval on an already-vetted Constant / signed number: no evaluation risk.
    value = ast.literal_eval(node)
    if not isinstance(value, (int, float, str, bool, type(None))):
        raise SpecError(f"parameter {key} of {name}: {type(value).__name__} literals are "
                        "not allowed", param="strategy")
    return value


def _disallowed(node: ast.AST, where: str) -> SpecError:
    kind = _SYNTAX_NAMES.get(type(node).__name__, type(node).__name__)
    return SpecError(f"{kind} ({_show(node)!r}) is not allowed in a strategy spec: "
                     f"only names, calls, keyword arguments and literals; {where}",
                     param="strategy")


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show(node: ast.AST) -> str:
    """Source of ``node`` for an error message, clipped; never raises."""
    try:
        return _clip(ast.unparse(node))
    except RecursionError:  # e.g. n=------1 two thousand deep: unparse recurses per level
        return f"<{type(node).__name__} nested too deeply to show>"


# ----------------------------------------------------------------------------- validate


def validate_params(name: str, model: type[BaseModel], kwargs: Mapping[str, Any]) -> BaseModel:
    """Validate ``kwargs`` against a strategy's Params model.

    Raises:
        SpecError: naming the field, the expected type and what was given.
    """
    try:
        return model.model_validate(dict(kwargs))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        fields = list(model.model_fields)
        if err["type"] == "extra_forbidden":
            close = difflib.get_close_matches(field, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(fields) or "none"
            msg = f"{name} has no parameter {field!r}{hint} (parameters: {known})"
        else:
            info = model.model_fields.get(field)
            expected = type_name(info.annotation) if info is not None else "?"
            got = err.get("input")
            msg = (f"bad parameter for {name}: {field} expects {expected}, got "
                   f"{_clip(repr(got))} ({type(got).__name__}): {err['msg']}")
        raise SpecError(msg, param=field) from None


def check_inner_count(name: str, lo: int, hi: int | None, got: int) -> None:
    """Refuse a wrong number of inner strategies (the graph and Python construction).

    Raises:
        SpecError: e.g. "sc takes 1 inner strategy, got 2".
    """
    if got < lo or (hi is not None and got > hi):
        want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any number'}"
        raise SpecError(f"{name} takes {want} inner strateg{'y' if want == '1' else 'ies'}, "
                        f"got {got}", param="strategy")


def type_name(tp: Any) -> str:
    """A readable name for a type annotation: ``int``, ``float | None``, ``'a' | 'b'``."""
    args = get_args(tp)
    origin = get_origin(tp)
    if origin is None:
        return getattr(tp, "__name__", repr(tp)).replace("NoneType", "None")
    if getattr(origin, "__name__", "") == "Literal" or str(origin) == "typing.Literal":
        return " | ".join(repr(a) for a in args)
    if args:
        return " | ".join(type_name(a) for a in args)
    return str(tp)


def validate(g: nx.DiGraph, registry: Registry, *, max_depth: int = DEFAULT_MAX_DEPTH,
             max_fanout: int = DEFAULT_MAX_FANOUT, max_nodes: int = DEFAULT_MAX_NODES,
             max_calls: int | None = DEFAULT_MAX_CALLS) -> nx.DiGraph:
    """Check a parsed graph against the registry and the limits; return a new graph.

    Names become canonical (aliases resolved), default inner strategies are
    added as nodes, every node gets ``params`` (validated) and ``calls`` (its
    worst-case number of model requests); ``g.graph["worst_case_calls"]`` is
    the root's.

    Raises:
        SpecError: unknown name (with a "did you mean"), bad parameter, wrong
            number of inner strategies, depth / fan-out / size limits.
        BudgetError: the worst-case call count is above ``max_calls``.
    """
    g = g.copy()
    ids = itertools.count(max((int(n[1:]) for n in g.nodes), default=-1) + 1)
    # Depth first: a deep chain is also large, and "too deep" is the reason to report.
    depth = nx.dag_longest_path_length(g) + 1 if g.number_of_nodes() else 0
    if depth > max_depth:
        raise SpecError(f"strategy spec nests deeper than {max_depth} levels ({depth} "
                        "levels)", param="strategy")

    def check(nid: str, depth: int) -> None:
        data = g.nodes[nid]
        if depth > max_depth:
            raise SpecError(f"strategy spec nests deeper than {max_depth} levels "
                            f"(at {data['name']})", param="strategy")
        entry = _entry(registry, data["name"])
        data.update(name=entry.name, entry=entry,
                    params=validate_params(entry.name, entry.params, data["kwargs"]))
        kids = children(g, nid)
        if not kids:
            for order, sub in enumerate(entry.default_inner):
                _graft(g, nid, parse_spec(sub), order, ids)
            kids = children(g, nid)
        check_inner_count(entry.name, entry.min_inner, entry.max_inner, len(kids))
        if len(kids) > max_fanout:
            raise SpecError(f"{entry.name} has {len(kids)} inner strategies, above the "
                            f"fan-out limit of {max_fanout}", param="strategy")
        if g.number_of_nodes() > max_nodes:
            raise SpecError(f"strategy spec has more than {max_nodes} strategies",
                            param="strategy")
        for kid in kids:
            check(kid, depth + 1)

    check(g.graph["root"], 1)
    calls = worst_case_calls(g)
    g.graph["worst_case_calls"] = calls
    if max_calls is not None and calls > max_calls:
        raise BudgetError(f"strategy {to_spec(g)} may make up to {calls} model calls per "
                          f"task, above the limit of {max_calls}", param="strategy")
    return g


def _entry(registry: Registry, name: str) -> StrategyEntry:
    """The registry's entry for ``name`` (or an alias of it).

    Raises:
        SpecError: unknown name, with the closest known one and the list.
    """
    entry = registry.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted({e.name for e in registry.values()}))
        raise SpecError(f"unknown strategy {name!r}{hint} (known: {known})", param="strategy")
    return entry


def _graft(g: nx.DiGraph, parent: str, sub: nx.DiGraph, order: int,
           ids: itertools.count) -> None:
    mapping = {n: f"n{next(ids)}" for n in sub.nodes}
    for n, data in sub.nodes(data=True):
        g.add_node(mapping[n], **data)
    for a, b, data in sub.edges(data=True):
        g.add_edge(mapping[a], mapping[b], **data)
    g.add_edge(parent, mapping[sub.graph["root"]], order=order)


def children(g: nx.DiGraph, nid: str) -> list[str]:
    """A node's inner strategies, in spec order."""
    return sorted(g.successors(nid), key=lambda c: g.edges[nid, c]["order"])


def worst_case_calls(g: nx.DiGraph, nid: str | None = None) -> int:
    """Worst-case model requests per task of a validated graph (or of one node).

    Counts requests strategies make (a request with ``n`` samples is one);
    the Context's loop retries (at most one per looping sample) come on top
    and are still capped by the task's call budget. Also stores ``calls`` on
    every node.
    """
    nid = g.graph["root"] if nid is None else nid
    data = g.nodes[nid]
    if "entry" not in data:
        raise SpecError("worst_case_calls needs a validated graph (see validate)")
    kids = [ChildCost(g.nodes[k]["name"], worst_case_calls(g, k),
                      getattr(g.nodes[k]["entry"], "samples_in_one_request", False))
            for k in children(g, nid)]
    data["calls"] = int(data["entry"].worst_case(data["params"], kids))
    return data["calls"]


# ------------------------------------------------------------------------ build, render


def instantiate(g: nx.DiGraph, nid: str | None = None) -> Any:
    """Build the strategy tree of a validated graph, inner strategies first."""
    nid = g.graph["root"] if nid is None else nid
    data = g.nodes[nid]
    inner = [instantiate(g, k) for k in children(g, nid)]
    return data["entry"].build(inner, data["params"])


def build_strategy(spec: str, registry: Registry, *, max_calls: int | None = DEFAULT_MAX_CALLS,
                   max_depth: int = DEFAULT_MAX_DEPTH, max_fanout: int = DEFAULT_MAX_FANOUT,
                   max_nodes: int = DEFAULT_MAX_NODES) -> tuple[Any, nx.DiGraph]:
    """Parse, validate and instantiate a spec: ``(strategy, graph)``.

    Raises:
        SpecError: see :func:`parse_spec` and :func:`validate`.
        BudgetError: the spec's worst case exceeds ``max_calls``.
    """
    g = validate(parse_spec(spec), registry, max_depth=max_depth, max_fanout=max_fanout,
                 max_nodes=max_nodes, max_calls=max_calls)
    return instantiate(g), g


def format_call(name: str, inner: Sequence[str], params: Mapping[str, Any]) -> str:
    """``name(inner..., key=value...)``, or the bare name when both are empty."""
    args = [*inner, *(f"{k}={v!r}" for k, v in params.items())]
    return f"{name}({', '.join(args)})" if args else name


def non_default(params: BaseModel) -> dict[str, Any]:
    """Parameters that differ from their defaults, in field order (canonical specs)."""
    out = {}
    for key, info in type(params).model_fields.items():
        value = getattr(params, key)
        if info.is_required() or value != info.get_default(call_default_factory=True):
            out[key] = value
    return out


def to_spec(g: nx.DiGraph, nid: str | None = None) -> str:
    """The canonical spec of a validated graph: canonical names, default inner
    strategies written out, only non-default parameters. Parsing it gives the
    same graph (a round trip)."""
    nid = g.graph["root"] if nid is None else nid
    data = g.nodes[nid]
    return format_call(data["name"], [to_spec(g, k) for k in children(g, nid)],
                       non_default(data["params"]))


def to_mermaid(g: nx.DiGraph) -> str:
    """Mermaid flowchart text: one box per strategy (name, parameters, worst-case calls)."""
    lines = ["flowchart TD"]
    for nid, data in g.nodes(data=True):
        label = [data["name"]]
        params = non_default(data["params"]) if "params" in data else data["kwargs"]
        label += [f"{k}={v!r}" for k, v in params.items()]
        if "calls" in data:
            label.append(f"<= {data['calls']} calls")
        text = "<br/>".join(label).replace('"', "#quot;")
        lines.append(f'    {nid}["{text}"]')
    for nid in g.nodes:
        for kid in children(g, nid):
            lines.append(f"    {nid} --> {kid}")
    return "\n".join(lines)
