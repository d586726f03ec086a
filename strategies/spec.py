"""Strategy specs -> a validated networkx DiGraph -> an instantiated strategy tree.

A spec is a Python-call-shaped string, ``dei(ssr, critique_refine(rounds=2), sage(cot),
votes=5)``, parsed with ``ast.parse(mode="eval")``. Only names, calls, keyword
arguments and literals are allowed: nothing is ever evaluated. A bare name is the
call with defaults; positional arguments are inner strategies, keywords are
parameters (a bare name as a parameter is that string: ``beam(scorer=arith)``).
The graph has one node per strategy (``name``, the class, validated ``params``,
worst-case ``calls``) and ordered edges parent -> inner strategy.

The registry is an argument: a mapping from names and aliases to
:class:`~refinery.strategies.base.Strategy` classes, each of which carries what
the graph reads (``name``, ``Params``, ``min_inner``/``max_inner``,
``default_inner``, ``worst_case``, ``samples_in_one_request``, ``from_validated``).
This module names no strategy: ``base`` builds on it, and a registry of one's own
classes composes the same way as the package's.

Example:
    >>> from refinery.strategies.registry import REGISTRY
    >>> strategy, g = build_strategy("sc(cot, n=4)", REGISTRY)
    >>> worst_case_calls(g), to_spec(g)
    (1, 'sc(cot, n=4)')
    >>> print(to_mermaid(g))
    flowchart TD
        n0["sc<br/>n=4<br/><= 1 calls"]
        n1["cot<br/><= 1 calls"]
        n0 --> n1
"""

from __future__ import annotations

import ast
import difflib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

import networkx as nx
from pydantic import AfterValidator, BaseModel, ValidationError

from refinery.engine.errors import BudgetError, SpecError
from refinery.verifiers.steps import RegisteredName

if TYPE_CHECKING:  # base imports this module: the class is only named here
    from refinery.strategies.base import Strategy

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


Registry = Mapping[str, "type[Strategy]"]
"""Name or alias -> strategy class (``refinery.strategies.registry.REGISTRY`` is one)."""


# ------------------------------------------------------------------------------- parse


def parse_spec(spec: str) -> nx.DiGraph:
    """Parse a spec string into a raw graph (names as written, parameters unchecked).

    A node has ``name``, ``kwargs`` and ``bare``: the keywords given as a bare name
    (``scorer=arith``), kept as that string; :func:`validate` refuses one that names
    a strategy.

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
    g.add_node(nid, name=name, kwargs={}, bare=set())
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
        if isinstance(kw.value, ast.Name):  # a bare name: the string, where one is meant
            g.nodes[nid]["bare"].add(kw.arg)
            g.nodes[nid]["kwargs"][kw.arg] = kw.value.id
        else:
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
        if isinstance(node, ast.Call):
            raise SpecError(f"parameter {key} of {name} must be a literal, not "
                            f"{_show(node)!r} (inner strategies are positional)",
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
            expected = type_name(info.rebuild_annotation()) if info is not None else "?"
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
    """A type annotation as a person writes it: ``int``, ``float | None``, ``'a' | 'b'``
    for a Literal; a string checked against registered names (a
    :class:`~refinery.verifiers.steps.RegisteredName` validator) shows them.

    Pass ``FieldInfo.rebuild_annotation()`` for a model field: pydantic moves a
    field's own ``Annotated`` metadata off ``annotation``.

    Example:
        >>> from refinery.verifiers.steps import ScorerName
        >>> type_name(float | None), type_name(Literal["best", "last"])
        ('float | None', "'best' | 'last'")
        >>> type_name(ScorerName | None)
        'str (registered: arith, judge, prm) | None'
    """
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:  # constraints (ge=1) are left to the error message
        base, *metadata = args
        return type_name(base) + "".join(_registered_names(m) for m in metadata)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is Union or origin is UnionType:
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{type_name(origin)}[{', '.join(type_name(a) for a in args)}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", repr(tp))


def _registered_names(metadata: Any) -> str:
    check = metadata.func if isinstance(metadata, AfterValidator) else None
    if isinstance(check, RegisteredName):
        return f" (registered: {', '.join(check.allowed)})"
    return ""


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
        cls = _node_class(data, registry)
        kids = children(g, nid)
        if not kids:
            for order, sub in enumerate(cls.default_inner):
                _graft(g, nid, parse_spec(sub.name), order, ids)
            kids = children(g, nid)
        check_inner_count(cls.name, cls.min_inner, cls.max_inner, len(kids))
        if len(kids) > max_fanout:
            raise SpecError(f"{cls.name} has {len(kids)} inner strategies, above the "
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


def _node_class(data: dict[str, Any], registry: Registry) -> type[Strategy]:
    """Resolve a node's strategy class and validate its parameters, in place: ``name``
    becomes canonical, ``cls`` and ``params`` are set.

    Raises:
        SpecError: unknown name (with the closest known one and the list), a bare
            name that names a strategy given as a parameter, a bad parameter.
    """
    name = data["name"]
    cls = registry.get(name)
    if cls is None:
        close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted({c.name for c in registry.values()}))
        raise SpecError(f"unknown strategy {name!r}{hint} (known: {known})", param="strategy")
    for key in sorted(data.get("bare", ())):
        value = data["kwargs"][key]
        if value in registry:  # sc(n=cot): a strategy where a parameter goes, not 'cot'
            raise SpecError(f"parameter {key} of {name} is given the strategy {value!r}: "
                            "inner strategies are positional arguments; quote the "
                            f"string if that is meant ({key}={value!r})", param="strategy")
    data.update(name=cls.name, cls=cls,
                params=validate_params(cls.name, cls.Params, data["kwargs"]))
    return cls


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
    if "cls" not in data:
        raise SpecError("worst_case_calls needs a validated graph (see validate)")
    kids = [ChildCost(g.nodes[k]["name"], worst_case_calls(g, k),
                      g.nodes[k]["cls"].samples_in_one_request)
            for k in children(g, nid)]
    data["calls"] = int(data["cls"].worst_case(data["params"], kids))
    return data["calls"]


# ------------------------------------------------------------------------ build, render


def instantiate(g: nx.DiGraph, nid: str | None = None) -> Strategy:
    """Build the strategy tree of a validated graph, inner strategies first."""
    nid = g.graph["root"] if nid is None else nid
    data = g.nodes[nid]
    inner = [instantiate(g, k) for k in children(g, nid)]
    return data["cls"].from_validated(inner, data["params"])


def build_strategy(spec: str, registry: Registry, *, max_calls: int | None = DEFAULT_MAX_CALLS,
                   max_depth: int = DEFAULT_MAX_DEPTH, max_fanout: int = DEFAULT_MAX_FANOUT,
                   max_nodes: int = DEFAULT_MAX_NODES) -> tuple[Strategy, nx.DiGraph]:
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
