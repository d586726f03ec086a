"""The ``structured`` parameter: one decision, shown by the registry and the CLI."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from refinery import strategies
from refinery.cli import app
from refinery.engine.constraints import Constraint, StructuredModeError, structured_mode
from refinery.engine.context import Context
from refinery.engine.errors import SpecError
from refinery.engine.types import SamplingParams
from refinery.strategies.base import step_params
from tests.scripted_backend import ScriptedBackend

PARSING = ["best_of_n", "critique_refine", "ssr", "ssr_ada", "ssr_plan", "sage", "dei",
           "genselect", "pot", "tir"]


def test_structured_mode_decides_in_one_place():
    full = ScriptedBackend([])
    jsonly = ScriptedBackend([], structured_outputs=frozenset({"json"}))
    both = frozenset({"json", "regex"})
    assert structured_mode("x", None, both, full) is True
    assert structured_mode("x", True, both, full) is True
    assert structured_mode("x", False, both, full) is False
    assert structured_mode("x", None, both, jsonly) is False
    assert structured_mode("x", None, frozenset({"json"}), jsonly) is True
    assert structured_mode("x", True, frozenset(), jsonly) is False  # nothing to constrain
    assert structured_mode("x", None, both, object()) is False  # declares no kinds
    with pytest.raises(StructuredModeError) as info:
        structured_mode("x", True, both, jsonly)
    assert info.value.missing == ("regex",) and info.value.kind == "regex"
    assert info.value.param == "structured" and info.value.who == "x"


def test_every_parsing_strategy_lists_structured():
    described = {d["name"]: d["params"] for d in strategies.describe()}
    for name in PARSING:
        p = described[name]["structured"]
        assert (p["type"], p["default"]) == ("bool | None", None), name
        assert "free text" in p["description"]
    assert "structured" not in described["cot"] and "structured" not in described["sc"]
    out = CliRunner().invoke(app, ["strategies"]).output
    assert out.count("structured: bool | None = None  constrain the output") == len(PARSING)


def test_spec_language_takes_structured():
    assert repr(strategies.build("ssr(structured=False)")) == "ssr(cot, structured=False)"
    assert strategies.build("dei(cot, structured=True)").params.structured is True
    assert strategies.build("sage").params.structured is None
    with pytest.raises(SpecError, match=re.escape("structured expects bool | None, got 1")):
        strategies.build("critique_refine(structured=1)")


def test_a_bounded_constraint_raises_max_tokens_to_fit_its_longest_text():
    c = Constraint.from_regex(r"[^<]{0,40}<answer>[0-9]{1,4}</answer>")
    assert c.max_chars == 40 + len("<answer></answer>") + 4
    context = Context(ScriptedBackend([]), params=SamplingParams(max_tokens=16))
    assert step_params(context, c).max_tokens == c.max_chars + 1
    assert step_params(context, None).max_tokens == 16  # free text keeps the cap
    roomy = Context(ScriptedBackend([]), params=SamplingParams(max_tokens=512))
    assert step_params(roomy, c).max_tokens == 512  # never lowered
    assert Constraint.from_regex(r"a*").max_chars is None  # unbounded: nothing to raise to
