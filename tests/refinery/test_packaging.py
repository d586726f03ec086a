"""The distribution installs one top-level name, ``refinery``; the layers live under it,
every module and the web page's files with them, built without a warning."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo_layout import ROOT as REPO
from tests.repo_layout import modules, package_folders

LAYERS = [folder for folder in package_folders() if folder != "refinery"]
# The web page's files, package data a wheel must carry (no Node at run time: these are all).
UI_FILES = ["templates/base.html", "templates/playground.html", "templates/runs.html",
            "templates/run.html", "templates/trace.html", "templates/trace_open.html",
            "templates/login.html", "templates/error.html", "templates/_macros.html",
            "static/ui.css", "static/playground.js", "static/trace.js"]


def _python(code: str, cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin"} | ({"PYTHONPATH": pythonpath} if pythonpath else {})
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _installed_path(name: str, path: Path) -> str:
    """Where the module ``name`` (the file ``path`` of the clone) lands in site-packages."""
    return "/".join(name.split(".")) + ("/__init__.py" if path.name == "__init__.py" else ".py")


@pytest.mark.parametrize("layer", LAYERS)
def test_editable_install_exposes_only_refinery(layer: str, tmp_path: Path) -> None:
    # Run from outside the repository, so the clone's folders are not on sys.path.
    bare = _python(f"import {layer}", tmp_path)
    assert bare.returncode != 0 and "No module named" in bare.stderr
    named = _python(f"import refinery.{layer} as m; print(m.__name__)", tmp_path)
    assert named.returncode == 0, named.stderr
    assert named.stdout.strip() == f"refinery.{layer}"


def test_wheel_install_has_one_top_level_package(tmp_path: Path) -> None:
    # Built from a copy of what a build reads: setuptools writes build/ into the tree
    # it builds (and the clone's .venv links a whole virtualenv).
    source, target = tmp_path / "src", tmp_path / "site"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in package_folders():
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                            "--no-build-isolation", "--target", str(target), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    warnings = [line for line in (build.stdout + build.stderr).splitlines()
                if "warning" in line.lower()]
    assert warnings == []
    packages = sorted(p.name for p in target.iterdir()
                      if p.is_dir() and p.name != "bin"  # the console script
                      and not p.name.endswith((".dist-info", "__pycache__")))
    assert packages == ["refinery"]
    for layer in LAYERS:
        assert (target / "refinery" / layer / "__init__.py").is_file()
    ok = _python("import refinery.engine.errors as e; print(e.RefineryError.__module__)",
                 tmp_path, pythonpath=str(target))
    assert ok.stdout.strip() == "refinery.engine.errors", ok.stderr
    assert _python("import engine", tmp_path, pythonpath=str(target)).returncode != 0
    for name in UI_FILES:
        assert (target / "refinery" / "ui" / name).is_file(), name
    installed = {p.relative_to(target).as_posix() for p in (target / "refinery").rglob("*.py")}
    assert installed == {_installed_path(name, path) for name, path in modules().items()}
    # The installed page finds its templates and static files in the install, not the clone.
    page = _python("from refinery.ui.pages import STATIC, TEMPLATES, env; print(TEMPLATES); "
                   "print(STATIC); print(env.get_template('playground.html').name)",
                   tmp_path, pythonpath=str(target))
    assert page.stdout.split() == [str(target / "refinery" / "ui" / "templates"),
                                   str(target / "refinery" / "ui" / "static"),
                                   "playground.html"], page.stderr
