"""The layer rule: a package imports only from its own layer's allowed neighbours and below.

    engine <- verifiers <- strategies <- {serving, eval, distill, ui} <- refinery

The layers are pyproject.toml's ``[tool.refinery] layers`` (read through
tests/repo_layout.py, which also scans the imports). Every import counts,
deferred ones inside functions included, and a relative import counts as the
absolute module it resolves to. Among the four packages of the third layer only
the imports in ``SIBLINGS`` are allowed; docs/architecture.md draws the same
picture. A top-level folder that is a package but no layer fails too: it would
be neither checked here nor installed.
"""

from __future__ import annotations

from pathlib import Path

from tests.repo_layout import ROOT, imports, layers, modules

SIBLINGS = {
    # the loop samples and scores through eval's runner, datasets, metrics and Ray pool
    ("distill", "eval"),
    # the runs page reads eval run directories: results, run configs, report tables
    ("ui", "eval"),
    # the page is mounted in the server: its key check, config, error bodies, body limit
    ("ui", "serving"),
}

# Top-level packages that are not part of the distribution.
NOT_INSTALLED = {"tests"}


def layer_ranks(root: Path = ROOT) -> dict[str, int]:
    """Each package folder's layer, 0 the lowest."""
    return {folder: rank for rank, layer in enumerate(layers(root)) for folder in layer}


def _owner(name: str, ranks: dict[str, int]) -> str:
    """The package folder a dotted refinery name lives in (``refinery`` for the face)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ranks else "refinery"


def layer_violations(root: Path = ROOT,
                     siblings: set[tuple[str, str]] = SIBLINGS) -> list[str]:
    """``file:line imports NAME (why)`` for each import that breaks the layer rule."""
    ranks = layer_ranks(root)
    found = []
    for module, path in modules(root).items():
        package = path.relative_to(root).parts[0]
        for imp in imports(path, module):
            target = _owner(imp.name, ranks)
            upward = ranks[target] > ranks[package]
            sideways = (ranks[target] == ranks[package] and target != package
                        and (package, target) not in siblings)
            if upward or sideways:
                found.append(f"{path.relative_to(root)}:{imp.line} imports {imp.name} "
                             f"({package} may not import {target})")
    return found


def unlisted_packages(root: Path = ROOT) -> list[str]:
    """Top-level folders holding an ``__init__.py`` that no layer lists."""
    listed = set(layer_ranks(root)) | NOT_INSTALLED
    return sorted(d.name for d in root.iterdir()
                  if (d / "__init__.py").is_file() and d.name not in listed)


def test_no_package_imports_above_its_layer():
    found = layer_violations()
    assert not found, "imports that break the layer rule:\n" + "\n".join(found)


def test_every_allowed_sibling_import_is_used():
    unused = [pair for pair in SIBLINGS if layer_violations(ROOT, SIBLINGS - {pair}) == []]
    assert unused == [], "allowed but never imported: drop them from SIBLINGS"


def test_every_top_level_package_is_a_layer():
    assert unlisted_packages() == [], (
        "top-level packages in no layer of pyproject.toml's [tool.refinery] layers")


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    for folder in layer_ranks():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
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
        "engine/stops.py:4 imports refinery.strategies.cot (engine may not import strategies)",
        "serving/app.py:1 imports refinery.cli.app (serving may not import refinery)",
        "eval/runner.py:1 imports refinery.serving (eval may not import serving)",
    ]


def test_relative_imports_resolve_from_their_own_package(tmp_path):
    root = _tree(tmp_path, {
        # inside engine: allowed, however many levels it climbs within the package
        "engine/backends/vllm.py": "from ..errors import X\nfrom . import base\n",
        "engine/backends/factory.py": "from ...strategies import cot\n",
        "engine/backends/__init__.py": "from .. import loops\nfrom ... import verifiers\n",
        "distill/loop.py": "from ..eval.runner import run_eval\n",
        "ui/app.py": "from .. import distill\n",
        "refinery/__init__.py": "from . import serving\nfrom .cli import app\n",
    })
    assert layer_violations(root) == [
        "engine/backends/__init__.py:2 imports refinery.verifiers "
        "(engine may not import verifiers)",
        "engine/backends/factory.py:1 imports refinery.strategies.cot "
        "(engine may not import strategies)",
        "ui/app.py:1 imports refinery.distill (ui may not import distill)",
    ]


def test_a_package_folder_in_no_layer_fails(tmp_path):
    root = _tree(tmp_path, {"plugins/__init__.py": "", "bench/run.py": "",
                            "tests/__init__.py": ""})
    assert unlisted_packages(root) == ["plugins"]
