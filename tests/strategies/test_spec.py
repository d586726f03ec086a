"""Strategy specs: parsing, validation errors, worst-case cost, mermaid, round trip."""

from __future__ import annotations

import pytest

from refinery.engine.errors import BudgetError, SpecError
from refinery.strategies import Strategy, StrategyParams
from refinery.strategies.cot import CoT
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.dei import DEI
from refinery.strategies.registry import REGISTRY
from refinery.strategies.sage import SAGE
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.spec import (
    build_strategy,
    children,
    parse_spec,
    to_mermaid,
    to_spec,
    validate,
    worst_case_calls,
)
from refinery.strategies.ssr import SSR

COMPOSITE = "dei(ssr, critique_refine(rounds=2), sage(cot), votes=5)"


def test_parse_keeps_order_and_literals():
    g = parse_spec(COMPOSITE)
    root = g.graph["root"]
    assert g.nodes[root]["name"] == "dei" and g.nodes[root]["kwargs"] == {"votes": 5}
    kids = children(g, root)
    assert [g.nodes[k]["name"] for k in kids] == ["ssr", "critique_refine", "sage"]
    assert g.nodes[kids[1]]["kwargs"] == {"rounds": 2}
    assert parse_spec("sage(temperature=-0.0, rounds=+1)").nodes["n0"]["kwargs"] == \
        {"temperature": -0.0, "rounds": 1}


def test_build_composite_instantiates_the_tree():
    strategy, g = build_strategy(COMPOSITE, REGISTRY)
    assert isinstance(strategy, DEI) and strategy.params.votes == 5
    ssr, cr, sage = strategy.inner
    assert isinstance(ssr, SSR) and isinstance(ssr.inner[0], CoT)  # default inner
    assert isinstance(cr, CritiqueRefine) and cr.params.rounds == 2
    assert isinstance(sage, SAGE) and isinstance(sage.inner[0], CoT)
    # ssr(cot): 1 + 5 assessments x 18 + 4 refinements x 2 = 99; critique_refine: 1 + 5;
    # sage(cot): 2 + 1; dei: members + 2 x 3 review requests
    assert worst_case_calls(g) == 99 + 6 + 3 + 6 == g.graph["worst_case_calls"]


@pytest.mark.parametrize("spec, calls", [
    ("cot", 1), ("sc(cot, n=8)", 1), ("sc(sage(cot), n=4)", 12),
    # cot's variants also sample n attempts in one request
    ("sc(re2, n=8)", 1), ("sc(cot_reflection, n=4)", 1), ("best_of_n(re2, n=3)", 4),
    ("best_of_n(n=3)", 4), ("critique_refine(rounds=0)", 2), ("dei(cot, cot, votes=5)", 6),
])
def test_worst_case_calls(spec, calls):
    assert build_strategy(spec, REGISTRY)[1].graph["worst_case_calls"] == calls


def test_canonical_spec_round_trip():
    _, g = build_strategy("self_consistency(cot, n=8, temperature=0.5)", REGISTRY)
    assert to_spec(g) == "sc(cot, temperature=0.5)"  # alias resolved, default n dropped
    _, g = build_strategy(COMPOSITE, REGISTRY)
    canonical = to_spec(g)
    assert canonical == "dei(ssr(cot), critique_refine(cot), sage(cot), votes=5)"
    _, again = build_strategy(canonical, REGISTRY)
    assert to_spec(again) == canonical


def test_unknown_name_suggests():
    with pytest.raises(SpecError, match=r"unknown strategy 'ssrr'; did you mean 'ssr'\?"):
        build_strategy("dei(ssrr, cot)", REGISTRY)
    known = ", ".join(sorted({e.name for e in REGISTRY.values()}))  # aliases left out
    with pytest.raises(SpecError) as caught:
        build_strategy("zzz", REGISTRY)
    assert str(caught.value).startswith(f"unknown strategy 'zzz' (known: {known}")
    assert "asc, auto, beam" in known and "self_consistency" not in known


def test_bad_parameter_names_field_and_type():
    with pytest.raises(SpecError, match=r"bad parameter for sc: n expects int, got 'x' \(str\)"):
        build_strategy("sc(cot, n='x')", REGISTRY)
    with pytest.raises(SpecError, match="n expects int, got 0 .*greater than or equal to 1"):
        build_strategy("sc(n=0)", REGISTRY)
    with pytest.raises(SpecError, match="early_exit expects bool, got 1"):
        build_strategy("ssr(early_exit=1)", REGISTRY)
    with pytest.raises(SpecError, match="scorer expects 'auto' \\| 'verifier' \\| 'judge'"):
        build_strategy("best_of_n(scorer='vote')", REGISTRY)
    with pytest.raises(SpecError, match=r"sc has no parameter 'nn'; did you mean 'n'\?") as e:
        build_strategy("sc(nn=3)", REGISTRY)
    assert e.value.param == "nn"


@pytest.mark.parametrize("spec, message", [
    ("__import__('os')", "'__import__' is not a strategy name"),
    ("os.system('ls')", "attribute access"),
    ("sc(cot).solve", "attribute access"),
    ("sc(cot)[0]", "subscripting"),
    ("sc(cot, n=4*2)", "arithmetic"),
    ("sc(cot, n=[8])", "lists"),
    ("lambda: cot", "lambda"),
    ("sc(*cots)", r"\*args"),
    ("sc(**opts)", r"\*\*kwargs"),
    ("sc(cot, n=cot())", "must be a literal, not 'cot\\(\\)'"),
    ("sc(8)", "must be an inner strategy"),
    ("sc(cot", "does not parse"),
    ("sc(cot)()", "must be a strategy name"),
    ("", "empty"),
    ("sc(" * 1000, "longer than"),
])
def test_disallowed_syntax(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_structure_limits():
    with pytest.raises(SpecError, match="cot takes 0 inner strategies, got 1"):
        build_strategy("cot(cot)", REGISTRY)
    with pytest.raises(SpecError, match="sc takes 1 inner strategy, got 2"):
        build_strategy("sc(cot, cot)", REGISTRY)
    with pytest.raises(SpecError, match="deeper than 3 levels"):
        build_strategy("sc(sc(sc(cot)))", REGISTRY, max_depth=3)
    with pytest.raises(SpecError, match="fan-out limit of 8"):
        build_strategy("dei(" + ", ".join(["cot"] * 9) + ")", REGISTRY)


def test_worst_case_above_bound_is_refused():
    with pytest.raises(BudgetError, match=r"sc\(ssr\(cot\), n=32\) may make up to 3168 model"):
        build_strategy("sc(ssr, n=32)", REGISTRY)
    with pytest.raises(BudgetError, match="above the limit of 50"):
        build_strategy("ssr", REGISTRY, max_calls=50)
    assert build_strategy("ssr", REGISTRY, max_calls=None)[1].graph["worst_case_calls"] == 99


def test_mermaid():
    _, g = build_strategy("sc(sage(cot), n=4)", REGISTRY)
    assert to_mermaid(g).splitlines() == [
        "flowchart TD",
        '    n0["sc<br/>n=4<br/><= 12 calls"]',
        '    n1["sage<br/><= 3 calls"]',
        '    n2["cot<br/><= 1 calls"]',
        "    n0 --> n1",
        "    n1 --> n2",
    ]
    _, g = build_strategy("cot(instruction='say \"hi\"')", REGISTRY)
    assert "#quot;hi#quot;" in to_mermaid(g) and '"hi"' not in to_mermaid(g)


def test_a_bare_name_is_a_string_parameter():
    g = parse_spec("beam(scorer=judge, width=2)")
    assert g.nodes["n0"]["kwargs"] == {"scorer": "judge", "width": 2}
    assert g.nodes["n0"]["bare"] == {"scorer"}
    strategy, g = build_strategy("beam(scorer=judge)", REGISTRY)
    quoted, gq = build_strategy('beam(scorer="judge")', REGISTRY)
    assert strategy.params == quoted.params and strategy.params.scorer == "judge"
    assert to_spec(g) == to_spec(gq) == "beam(scorer='judge')"
    assert build_strategy("best_of_n(step_scorer=prm)", REGISTRY)[0].params.step_scorer == "prm"
    # still checked as the string it is
    with pytest.raises(SpecError, match="unknown step scorer 'nope'; known: arith, judge, prm"):
        build_strategy("beam(scorer=nope)", REGISTRY)
    with pytest.raises(SpecError, match=r"n expects int, got 'eight' \(str\)"):
        build_strategy("sc(cot, n=eight)", REGISTRY)


@pytest.mark.parametrize("spec, key, value", [
    ("memory(store=cot)", "store", "cot"), ("beam(scorer=sc)", "scorer", "sc"),
    ("sc(cot, n=self_consistency)", "n", "self_consistency"),  # an alias too
])
def test_a_bare_strategy_name_as_a_parameter_is_refused(spec, key, value):
    with pytest.raises(SpecError) as caught:
        build_strategy(spec, REGISTRY)
    name = spec.split("(")[0]
    assert caught.value.message == (
        f"parameter {key} of {name} is given the strategy {value!r}: inner strategies are "
        f"positional arguments; quote the string if that is meant ({key}={value!r})")
    # quoted, the same name is a string like any other
    assert build_strategy(f"memory(store='{value}')", REGISTRY)[0].params.store == value


# Strategies of one's own: Strategy subclasses, in a registry of their own or added to
# the package's. The graph reads everything off the class.
class Leaf(Strategy):
    name = "leaf"

    class Params(StrategyParams):
        k: int = 2

    @staticmethod
    def worst_case(params, children):
        return params.k


class Pair(Strategy):
    name = "pair"
    min_inner = max_inner = 2
    default_inner = (Leaf, Leaf)

    class Params(StrategyParams):
        times: int = 1

    @staticmethod
    def worst_case(params, children):
        return sum(c.calls for c in children) * params.times


def test_a_registry_of_ones_own_classes():
    registry = {"leaf": Leaf, "pair": Pair, "duo": Pair}
    g = validate(parse_spec("duo(times=3)"), registry)
    assert to_spec(g) == "pair(leaf, leaf, times=3)" and worst_case_calls(g) == 12
    strategy, _ = build_strategy("pair(leaf(k=5), leaf)", registry)
    # built with from_validated: the params the graph validated, the inner strategies
    assert isinstance(strategy, Pair) and [s.params.k for s in strategy.inner] == [5, 2]
    with pytest.raises(SpecError, match=r"unknown strategy 'cot' \(known: leaf, pair\)"):
        build_strategy("pair(cot, leaf)", registry)


def test_ones_own_classes_compose_with_the_packages():
    registry = {**REGISTRY, "pair": Pair, "leaf": Leaf}
    _, g = build_strategy("sc(pair(cot, leaf(k=4)), n=3)", registry)
    # cot's one-request sampling is read off its class: pair's is not one request
    assert to_spec(g) == "sc(pair(cot, leaf(k=4)), n=3)" and worst_case_calls(g) == 15
    assert worst_case_calls(build_strategy("sc(cot, n=3)", registry)[1]) == 1
    with pytest.raises(SpecError, match="unknown strategy 'pair'"):
        build_strategy("pair", REGISTRY)


def test_python_construction_matches_spec():
    assert repr(SelfConsistency(SAGE(CoT()), n=4)) == "sc(sage(cot), n=4)"
