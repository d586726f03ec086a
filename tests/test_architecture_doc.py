"""docs/architecture.md names every module of the package folders, and only those.

Its module tables say what each file holds: a table's header names a folder
(``| `serving/` | holds |``) and each row's first cell the files it describes,
relative to that folder (``| `state.py`, `config.py` | ... |``). A module added
without a row, or a row left behind by a module moved away, fails here.
``__init__.py`` files are not listed: they re-export.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.repo_layout import ROOT, modules

DOC = ROOT / "docs" / "architecture.md"
TICKED = re.compile(r"`([^`]+)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def documented_modules(text: str) -> list[str]:
    """Every file the module tables of ``text`` list, as a path from the repository root."""
    found, folder = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            folder = None
            continue
        first = _cells(line)[0]
        if folder is None:  # a table's header row
            names = TICKED.findall(first)
            folder = names[0] if len(names) == 1 and names[0].endswith("/") else ""
        elif folder and not set(first) <= set("-: "):
            found += [folder + name for name in TICKED.findall(first)]
    return found


def package_modules(root: Path = ROOT) -> list[str]:
    """Every module file of the package folders but ``__init__.py``, from the root."""
    return sorted(path.relative_to(root).as_posix() for path in modules(root).values()
                  if path.name != "__init__.py")


def test_module_tables_are_read_from_their_folder():
    text = ("| `engine/` | holds |\n|---|---|\n| `stops.py`, `loops.py` | rules |\n"
            "| `backends/base.py` | the protocol |\n\n| module | holds |\n|---|---|\n"
            "| `app.py` | not a module table: no folder in its header |\n")
    assert documented_modules(text) == ["engine/stops.py", "engine/loops.py",
                                        "engine/backends/base.py"]


def test_architecture_doc_lists_every_module_once():
    listed = documented_modules(DOC.read_text(encoding="utf-8"))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert twice == [], "listed in more than one row of docs/architecture.md"
    tree = package_modules()
    missing = sorted(set(tree) - set(listed))
    assert missing == [], "modules docs/architecture.md's tables do not list"
    gone = sorted(set(listed) - set(tree))
    assert gone == [], "rows of docs/architecture.md for modules that do not exist"
