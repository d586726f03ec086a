"""The repository's layout, read in one place: its layers, its modules, their imports.

The layer list is pyproject.toml's ``[tool.refinery] layers`` (setup.py builds the
wheel from it); each layer folder installs as ``refinery.<folder>``. The layer
test, the import-cycle check (scripts/check_imports.py), the doctest runner and
the architecture doc's test all read the tree through these functions, and
``imports`` is the one scanner of import statements they share.

>>> layers()[0], layers()[-1]
(['engine'], ['refinery'])
>>> module_name(ROOT / "engine" / "backends" / "__init__.py")
'refinery.engine.backends'
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli to Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def layers(root: Path = ROOT) -> list[list[str]]:
    """The layers, lowest first, each a list of package folders."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return config["tool"]["refinery"]["layers"]


def package_folders(root: Path = ROOT) -> list[str]:
    """Every layer's folders, lowest layer first."""
    return [folder for layer in layers(root) for folder in layer]


def module_name(path: Path, root: Path = ROOT) -> str:
    """The dotted name ``path`` installs as: ``engine/stops.py`` is ``refinery.engine.stops``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "refinery" else ["refinery", *parts])


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package folders: dotted name -> file, in folder order."""
    return {module_name(path, root): path
            for folder in package_folders(root)
            for path in sorted((root / folder).rglob("*.py"))
            if "__pycache__" not in path.parts}


@dataclass(frozen=True)
class Import:
    """One refinery name an import statement brings in, and the statement's line.

    ``name`` is dotted: the module for ``import m``, ``m.x`` for ``from m import x``
    (``x`` may be a submodule or an attribute of ``m``: the reader decides).
    ``type_only`` when it sits under ``if TYPE_CHECKING:``: a dependency all the
    same, but never run, so it closes no import cycle.
    """

    line: int
    name: str
    type_only: bool = False


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a ``from`` import names, relative levels resolved from ``module``.

    A level that climbs above ``refinery`` resolves to ``refinery``: out of every
    layer, so the layer test always reports it.
    """
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:max(len(package) - node.level + 1, 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _statements(nodes, type_only: bool = False):
    """Each import statement among ``nodes`` and below, and whether it is under
    ``if TYPE_CHECKING:``."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, type_only
        elif _is_type_checking(node):
            yield from _statements(node.body, True)
            yield from _statements(node.orelse, type_only)
        else:
            yield from _statements(ast.iter_child_nodes(node), type_only)


def imports(path: Path, module: str) -> list[Import]:
    """Every refinery name the file ``path`` (the module ``module``) imports.

    Imports inside functions count (deferring an import hides a dependency, it
    does not remove it), and a relative import counts as the absolute name it
    resolves to.
    """
    is_package = path.name == "__init__.py"
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node, type_only in _statements([tree]):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = _absolute(node, module, is_package)
            names = [f"{base}.{alias.name}" for alias in node.names]
        found += [Import(node.lineno, name, type_only) for name in names
                  if name.split(".")[0] == "refinery"]
    return sorted(found, key=lambda i: (i.line, i.name))
