"""Find import cycles among refinery's modules, and import each module alone.

Static part: every ``import`` / ``from ... import`` of a ``refinery`` module,
anywhere in a file (deferred imports inside functions count: a deferred import
hides a cycle, it does not remove it; relative ones count as what they resolve
to), becomes an edge; any cycle is reported. The modules are those of the layer
folders pyproject.toml lists, read by the layer test's scanner (tests/repo_layout.py).
Dynamic part (``--fresh``): each module is imported in a fresh interpreter, so
an order-dependent import (one that works only after some other module ran)
shows up.

    python scripts/check_imports.py            # cycles only (fast; also a test)
    python scripts/check_imports.py --fresh    # and one interpreter per module
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import networkx as nx

# The layer list and the import scanner are the layer test's: tests/repo_layout.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.repo_layout import imports, modules  # noqa: E402


def _target(name: str, mods: dict[str, Path]) -> str | None:
    """The module an imported name lands in: ``m.x`` is the submodule ``m.x`` when
    there is one, else the module ``m`` (``x`` is one of its attributes)."""
    if name in mods:
        return name
    parent = name.rpartition(".")[0]
    return parent if parent in mods else None


def import_graph(mods: dict[str, Path] | None = None) -> nx.DiGraph:
    mods = modules() if mods is None else mods
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        # under `if TYPE_CHECKING:` an import never runs: it closes no cycle
        targets = {_target(imp.name, mods) for imp in imports(path, name) if not imp.type_only}
        g.add_edges_from((name, t) for t in targets if t is not None and t != name)
    return g


def cycles(g: nx.DiGraph) -> list[list[str]]:
    """Each import cycle, in import order, starting (and ending) at its smallest name."""
    out = []
    for c in nx.simple_cycles(g):
        k = c.index(min(c))
        out.append([*c[k:], *c[:k], c[k]])
    return sorted(out)


def import_alone(name: str) -> str | None:
    """None when ``import name`` works in a fresh interpreter, else its error."""
    p = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                       text=True, timeout=300)
    return None if p.returncode == 0 else p.stderr.strip().splitlines()[-1]


def main() -> int:
    mods = modules()
    found = cycles(import_graph(mods))
    for c in found:
        print("cycle:", " -> ".join(c))
    failed = 0
    if "--fresh" in sys.argv:
        # a __main__ module is a program: importing it runs it
        importable = [name for name in mods if not name.endswith(".__main__")]
        with ThreadPoolExecutor(2) as pool:
            for name, err in zip(importable, pool.map(import_alone, importable), strict=True):
                print(f"{'FAIL' if err else 'ok  '} {name}" + (f": {err}" if err else ""))
                failed += err is not None
    print(f"{len(mods)} modules, {len(found)} cycles, {failed} failed fresh imports")
    return 1 if found or failed else 0


if __name__ == "__main__":
    sys.exit(main())
