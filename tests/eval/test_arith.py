"""The arith generator: seeded, prefix-stable, right answers, levels apart, splits disjoint."""

from __future__ import annotations

import pytest

from refinery.eval.arith import ARITH_LEVELS, load_arith
from refinery.eval.example import DatasetError, Example


def _replay(ex: Example) -> int:
    """Recompute an arith answer from its start value and recorded steps."""
    value = int(ex.prompt.split(" has ", 1)[1].split()[0])
    for step in ex.private["steps"]:
        op, k = step[0], int(step[1:])
        if op == "+":
            value += k
        elif op == "-":
            value -= k
        elif op == "*":
            value *= k
        else:
            assert value % k == 0
            value //= k
        assert value >= 0
    return value


def test_arith_is_deterministic_prefix_stable_and_correct() -> None:
    a, b = load_arith(limit=100), load_arith(limit=100)
    assert [e.model_dump() for e in a] == [e.model_dump() for e in b]
    assert [e.id for e in load_arith(limit=17)] == [e.id for e in a[:17]]
    assert [e.prompt for e in load_arith(limit=17)] == [e.prompt for e in a[:17]]
    assert [e.level for e in a[:10]] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    assert len({e.id for e in a}) == 100 and len({e.prompt for e in a}) == 100
    assert all(str(_replay(e)) == e.gold for e in a)
    assert load_arith(limit=20, seed=1)[0].prompt != a[0].prompt
    assert "steps" not in a[0].to_task().model_dump_json()
    assert a[0].to_task().metadata["level"] == 1


def test_arith_levels_differ() -> None:
    exs = load_arith(limit=500)
    by = {lv: [e for e in exs if e.level == lv] for lv in range(1, 6)}
    assert all(len(v) == 100 for v in by.values())
    for lv, group in by.items():
        assert all(len(e.private["steps"]) == ARITH_LEVELS[lv][0] for e in group)
    sentences = [sum(e.prompt.count(".") for e in by[lv]) / 100 for lv in range(1, 6)]
    assert sentences == sorted(sentences) and sentences[0] < sentences[-1]
    assert {s[0] for e in by[1] for s in e.private["steps"]} == set("+-")
    assert any(s[0] == "/" for e in by[5] for s in e.private["steps"])
    assert [e.level for e in load_arith(limit=6, levels=[2, 5])] == [2, 5, 2, 5, 2, 5]
    with pytest.raises(DatasetError):
        load_arith(levels=[0, 6])


def test_arith_train_and_test_never_overlap() -> None:
    train = load_arith("train", limit=3000)
    test = load_arith("test", limit=1000)
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert not {e.id for e in train} & {e.id for e in test}
    assert len({e.prompt for e in train}) == 3000
    # also across seeds: the split is a property of the text, not of the stream
    assert not {e.prompt for e in load_arith("train", limit=1000, seed=7)} & {
        e.prompt for e in test}
