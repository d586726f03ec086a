"""Find import cycles among refinery's modules, and import each module alone.

Static part: every ``import`` / ``from ... import`` of a ``refinery`` module,
anywhere in a file (deferred imports inside functions count: a deferred import
hides a cycle, it does not remove it), becomes an edge; any cycle is reported.
Dynamic part (``--fresh``): each module is imported in a fresh interpreter, so
an order-dependent import (one that works only after some other module ran)
shows up.

    python scripts/check_imports.py            # cycles only (fast; also a test)
    python scripts/check_imports.py --fresh    # and one interpreter per module
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import networkx as nx

import refinery

LAYERS = ("engine", "verifiers", "strategies", "serving", "eval", "distill", "ui")


def modules() -> dict[str, Path]:
    """Every module of the refinery distribution: dotted name -> file."""
    out = {"refinery": Path(refinery.__file__)}
    for info in pkgutil.iter_modules(refinery.__path__, "refinery."):
        out[info.name] = Path(refinery.__path__[0]) / f"{info.name.split('.')[-1]}.py"
    for layer in LAYERS:
        # find_spec, not import: the editable install maps the layer folders by name.
        spec = importlib.util.find_spec(f"refinery.{layer}")
        out[spec.name] = Path(spec.origin)
        for info in pkgutil.walk_packages(spec.submodule_search_locations, f"{spec.name}."):
            sub = importlib.util.find_spec(info.name)
            if sub is not None and sub.origin:
                out[info.name] = Path(sub.origin)
    return out


def _targets(node: ast.AST, mods: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
        return []
    if node.module not in mods:
        return []
    # "from pkg import sub" imports the submodule when there is one, else pkg itself
    subs = [f"{node.module}.{a.name}" for a in node.names]
    return [s if s in mods else node.module for s in subs]


def import_graph(mods: dict[str, Path] | None = None) -> nx.DiGraph:
    mods = modules() if mods is None else mods
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            g.add_edges_from((name, t) for t in _targets(node, mods) if t != name)
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
        with ThreadPoolExecutor(2) as pool:
            for name, err in zip(mods, pool.map(import_alone, mods), strict=True):
                print(f"{'FAIL' if err else 'ok  '} {name}" + (f": {err}" if err else ""))
                failed += err is not None
    print(f"{len(mods)} modules, {len(found)} cycles, {failed} failed fresh imports")
    return 1 if found or failed else 0


if __name__ == "__main__":
    sys.exit(main())
