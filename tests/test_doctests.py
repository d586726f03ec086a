"""Every ``>>>`` example in the package modules runs, one test case per module.

The modules are found in the layer folders (tests/repo_layout.py); a module
whose source holds no ``>>>`` is no case. Examples run as
``pytest --doctest-modules`` runs them (``ELLIPSIS`` on), against the installed
name (``refinery.engine.stops``). An example that needs an engine, a server or
an event loop says so itself, ``# doctest: +SKIP``; a module none of whose
examples can run here is in ``NOT_RUN`` with its reason.
"""

from __future__ import annotations

import doctest
import importlib

import pytest

from tests.repo_layout import modules

# Modules whose examples are not run here, each with why.
NOT_RUN: dict[str, str] = {}

WITH_EXAMPLES = sorted(name for name, path in modules().items()
                       if ">>>" in path.read_text(encoding="utf-8"))


def failed_examples(name: str) -> tuple[int, str]:
    """How many examples the module ``name`` holds (skipped ones included), and the
    report of those that failed."""
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    found = 0
    for test in doctest.DocTestFinder().find(module, name):
        found += len(test.examples)
        runner.run(test, out=report.append)
    return found, "".join(report)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_examples_pass(name: str) -> None:
    if name in NOT_RUN:
        pytest.skip(NOT_RUN[name])
    found, report = failed_examples(name)
    assert report == "", report
    assert found > 0, f"{name} writes >>> where doctest finds no example"


def test_a_failing_example_is_reported(tmp_path, monkeypatch) -> None:
    (tmp_path / "sample_examples.py").write_text(
        '"""Two examples.\n\n>>> 1 + 1\n2\n>>> 0.1 + 0.2\n0.3\n"""\n')
    monkeypatch.syspath_prepend(tmp_path)
    found, report = failed_examples("sample_examples")
    assert found == 2
    assert "Failed example:\n    0.1 + 0.2\nExpected:\n    0.3\nGot:\n    0.30000000000000004" \
        in report
