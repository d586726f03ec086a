"""A turn whose answer may be a tool call runs as the strategy's tool-turn form: the
strategies that vote on or score their samples keep their place, any other gives way
to its first inner strategy, and a leaf that cannot act becomes cot."""

from __future__ import annotations

import pytest

from refinery.strategies import describe
from refinery.strategies.registry import build, tool_turn_form


@pytest.mark.parametrize(("spec", "form"), [
    ("cot", "cot(instruction='')"),
    ("cot(instruction='Be brief.')", "cot(instruction='Be brief.')"),
    ("sc(cot, n=5)", "sc(cot(instruction=''), n=5)"),
    ("sc(ssr(cot), n=4)", "sc(cot(instruction=''), n=4)"),
    ("best_of_n(moa(cot), n=3)", "best_of_n(cot(instruction=''), n=3)"),
    ("dei(ssr, critique_refine, sage(cot))", "cot(instruction='')"),
    ("deepconf(cot, n=4)", "deepconf(cot(instruction=''), n=4)"),
    ("asc(re2, max_n=8)", "asc(re2, max_n=8)"),
    ("cot_reflection", "cot(instruction='')"),
    ("pot", "cot(instruction='')"),
])
def test_the_tool_turn_form_of_a_spec(spec, form):
    assert repr(tool_turn_form(build(spec))) == form


def test_a_strategy_that_acts_is_returned_as_it_is():
    strategy = build("sc(re2, n=3)")
    assert tool_turn_form(strategy) is strategy


def test_refinery_strategies_says_which_act_on_tool_turns():
    acting = {d["name"] for d in describe() if d["tool_turns"]}
    assert acting == {"cot", "sc", "asc", "best_of_n", "deepconf", "re2"}
