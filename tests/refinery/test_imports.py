"""No refinery module imports itself back, directly or through others (deferred
imports inside functions and relative imports included; an import under
``if TYPE_CHECKING:`` never runs and closes no cycle)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_imports.py"
_spec = importlib.util.spec_from_file_location("check_imports", SCRIPT)
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def test_no_import_cycles() -> None:
    mods = check_imports.modules()
    assert {"refinery.strategies.base", "refinery.verifiers.base",
            "refinery.strategies.spec", "refinery.distill.dataset"} <= set(mods)
    g = check_imports.import_graph(mods)
    # the check sees the edges a cycle through the bases would take (it can fail)
    assert g.has_edge("refinery.strategies.registry", "refinery.strategies.base")
    assert g.has_edge("refinery.verifiers.math", "refinery.verifiers.base")
    assert check_imports.cycles(g) == []


def test_a_deferred_import_counts(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("from refinery.y import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from refinery.x import g\n")
    g = check_imports.import_graph({"refinery.x": tmp_path / "a.py",
                                    "refinery.y": tmp_path / "b.py"})
    assert check_imports.cycles(g) == [["refinery.x", "refinery.y", "refinery.x"]]


def test_a_relative_import_counts_and_a_type_only_one_closes_no_cycle(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("from . import y\n")
    (tmp_path / "y.py").write_text("from typing import TYPE_CHECKING\n\n"
                                   "if TYPE_CHECKING:\n    from refinery.x import g\n")
    g = check_imports.import_graph({"refinery.x": tmp_path / "x.py",
                                    "refinery.y": tmp_path / "y.py"})
    assert sorted(g.edges) == [("refinery.x", "refinery.y")]
    assert check_imports.cycles(g) == []
