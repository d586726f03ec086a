"""The layer rule: a package imports only from its own layer's allowed neighbours and below.

    engine <- verifiers <- strategies <- {serving, eval, distill, ui} <- refinery

Every import counts, deferred ones inside functions included (a deferred import
hides a dependency, it does not remove it), and a relative import counts as the
absolute module it resolves to. Among the four packages of the third layer only
the imports in ``SIBLINGS`` are allowed; docs/architecture.md draws the same
picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYER = {"engine": 0, "verifiers": 1, "strategies": 2,
         "serving": 3, "eval": 3, "distill": 3, "ui": 3, "refinery": 4}

SIBLINGS = {
    # the loop samples and scores through eval's runner, datasets, metrics and Ray pool
    ("distill", "eval"),
    # the runs page reads eval run directories: results, run configs, report tables
    ("ui", "eval"),
    # the page is mounted in the server: its key check, config, error bodies, body limit
    ("ui", "serving"),
}


def _package_of(path: Path, root: Path) -> list[str]:
    """The dotted package a module's relative imports start from, as parts.

    ``engine/backends/vllm.py`` and ``engine/backends/__init__.py`` both sit in
    ``refinery.engine.backends``; ``refinery/cli.py`` sits in ``refinery``.
    """
    parts = list(path.relative_to(root).parts[:-1])
    return parts if parts[0] == "refinery" else ["refinery", *parts]


def _absolute(node: ast.ImportFrom, package: list[str]) -> str:
    """The module a ``from`` import names, relative levels resolved against ``package``.

    A level that climbs above ``refinery`` resolves to ``refinery``: out of every
    layer, so the import is always reported.
    """
    if not node.level:
        return node.module or ""
    base = package[:max(len(package) - node.level + 1, 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(node: ast.AST, package: list[str]) -> list[tuple[str, str]]:
    """(owning package, module) for each refinery module ``node`` imports; the owner is
    ``refinery`` for the top package (``refinery.cli``, ``refinery`` itself)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        module = _absolute(node, package)
        # "from refinery import serving" imports the package serving
        names = [f"refinery.{a.name}" for a in node.names] if module == "refinery" else [module]
    else:
        return []
    out = []
    for name in names:
        parts = name.split(".")
        if parts[0] == "refinery":
            owner = parts[1] if len(parts) > 1 and parts[1] in LAYER else "refinery"
            out.append((owner, name))
    return out


def layer_violations(root: Path, siblings: set[tuple[str, str]] = SIBLINGS) -> list[str]:
    """``file:line imports MODULE`` for each import that breaks the layer rule."""
    found = []
    for package, rank in LAYER.items():
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            where = _package_of(path, root)
            for node in ast.walk(tree):
                for target, module in _imported(node, where):
                    upward = LAYER[target] > rank
                    sideways = (LAYER[target] == rank and target != package
                                and (package, target) not in siblings)
                    if upward or sideways:
                        found.append(f"{path.relative_to(root)}:{node.lineno} imports "
                                     f"{module} ({package} may not import {target})")
    return found


def test_no_package_imports_above_its_layer():
    found = layer_violations(ROOT)
    assert not found, "imports that break the layer rule:\n" + "\n".join(found)


def test_every_allowed_sibling_import_is_used():
    unused = [pair for pair in SIBLINGS
              if layer_violations(ROOT, SIBLINGS - {pair}) == []]
    assert unused == [], "allowed but never imported: drop them from SIBLINGS"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in LAYER:
        (tmp_path / name).mkdir()
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_planted_upward_import_fails_with_its_file_and_line(tmp_path):
    root = _tree(tmp_path, {
        "engine/stops.py": "import os\n\ndef f():\n    from refinery.strategies import cot\n",
        "verifiers/math.py": "from refinery.engine.types import Task\n",
        "eval/runner.py": "from refinery import serving\n",
        "serving/app.py": "from refinery.cli import app\n",
    })
    assert layer_violations(root) == [
        "engine/stops.py:4 imports refinery.strategies (engine may not import strategies)",
        "serving/app.py:1 imports refinery.cli (serving may not import refinery)",
        "eval/runner.py:1 imports refinery.serving (eval may not import serving)",
    ]


def test_relative_imports_resolve_from_their_own_package(tmp_path):
    root = _tree(tmp_path, {
        # inside engine: allowed, however many levels it climbs within the package
        "engine/backends/vllm.py": "from ..errors import X\nfrom . import base\n",
        "engine/backends/factory.py": "from ...strategies import cot\n",
        "distill/loop.py": "from ..eval.runner import run_eval\n",
        "ui/app.py": "from .. import distill\n",
        "refinery/__init__.py": "from . import serving\nfrom .cli import app\n",
    })
    assert layer_violations(root) == [
        "engine/backends/factory.py:1 imports refinery.strategies "
        "(engine may not import strategies)",
        "ui/app.py:1 imports refinery.distill (ui may not import distill)",
    ]
