"""The registry: names and aliases -> classes, the README's table, parameter types."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import AfterValidator

from refinery.strategies import REGISTRY, STRATEGIES, describe
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.spec import type_name
from refinery.verifiers.steps import RegisteredName

README = Path(__file__).parents[2] / "README.md"


def test_names_and_aliases_map_to_the_classes():
    assert REGISTRY["sc"] is REGISTRY["self_consistency"] is SelfConsistency
    for cls, aliases in STRATEGIES:
        assert all(REGISTRY[key] is cls for key in (cls.name, *aliases))
        # the graph grafts default inner strategies by name
        assert all(REGISTRY[inner.name] is inner for inner in cls.default_inner)
    # no name or alias is taken twice (the mapping would keep only the last)
    assert len(REGISTRY) == sum(1 + len(aliases) for _, aliases in STRATEGIES) == 51


def readme_table_names() -> set[str]:
    """The strategy names the README's "## Strategies" table gives: the name each code
    span of a row's first cell starts with (``ssr(inner)``, ``ssr_ada`` -> both)."""
    section = README.read_text().split("\n## Strategies\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {m for row in rows for m in re.findall(r"`(\w+)", row.split(" | ")[0])}


def test_every_registered_strategy_has_a_row_in_the_readme_table():
    in_table = readme_table_names()
    missing = sorted(cls.name for cls, _ in STRATEGIES if cls.name not in in_table)
    assert missing == [], f"README.md's strategies table lacks {missing}"
    assert in_table == {cls.name for cls, _ in STRATEGIES}  # and names nothing else


# What a parameter's type may read as: a plain type, None, a quoted Literal option,
# or a string checked against registered names.
TYPE_PART = re.compile(r"str|int|float|bool|None|'[a-z_]+'|str \(registered: [a-z_]+(, [a-z_]+)*\)")


@pytest.mark.parametrize("cls", [cls for cls, _ in STRATEGIES], ids=lambda c: c.name)
def test_every_parameter_type_reads_as_written(cls):
    entry = next(d for d in describe() if d["name"] == cls.name)
    assert list(entry["params"]) == list(cls.Params.model_fields)
    for key, param in entry["params"].items():
        parts = param["type"].split(" | ")
        assert all(TYPE_PART.fullmatch(p) for p in parts), f"{cls.name}.{key}: {param['type']}"
        options = [ast.literal_eval(p) for p in parts if p.startswith("'")]
        if options:  # a Literal: the default is one of the options shown
            assert param["default"] in options


def test_parameter_types_exactly():
    params = {d["name"]: d["params"] for d in describe()}
    assert params["cot"]["temperature"]["type"] == "float | None"
    assert params["cot"]["instruction"]["type"] == "str"
    assert params["sc"]["n"]["type"] == "int"  # the bounds are the error message's
    assert params["ssr"]["early_exit"]["type"] == "bool"
    assert params["best_of_n"]["scorer"]["type"] == "'auto' | 'verifier' | 'judge'"
    assert params["best_of_n"]["step_scorer"]["type"] == \
        "str (registered: arith, judge, prm) | None"
    assert params["beam"]["scorer"]["type"] == "str (registered: arith, judge, prm)"


def test_type_name_reads_the_registered_names_when_it_renders():
    names: dict[str, object] = {"b": 1}
    checked = Annotated[str, AfterValidator(RegisteredName(names, "thing"))]
    assert type_name(checked) == "str (registered: b)"
    names["a"] = 2
    assert type_name(checked | None) == "str (registered: a, b) | None"
    assert type_name(Literal["x", 1]) == "'x' | 1"
    assert type_name(list[int] | dict[str, float]) == "list[int] | dict[str, float]"
