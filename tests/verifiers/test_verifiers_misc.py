"""Registry, exact/regex verifiers, the `refinery check` CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from refinery import verifiers
from refinery.cli.verifiers import check_group as check_app
from refinery.engine.errors import InvalidRequestError
from refinery.engine.types import Task
from refinery.verifiers import VERIFIERS, Verdict, Verifier, get_verifier
from refinery.verifiers.exact import ExactVerifier, RegexVerifier

TASK = Task.from_prompt("q")


def test_registry_builds_every_named_verifier() -> None:
    assert set(VERIFIERS) == {"math", "gsm8k", "code", "exact", "regex", "judge"}
    for name in VERIFIERS:
        kwargs = {"backend": object()} if name == "judge" else {}
        v = get_verifier(name, **kwargs)
        assert v.name == name and isinstance(v, Verifier)
    assert get_verifier("gsm8k", mode="strict").mode == "strict"
    with pytest.raises(InvalidRequestError, match="known: math, gsm8k"):
        get_verifier("nope")


def test_public_names() -> None:
    assert all(hasattr(verifiers, n) for n in verifiers.__all__)
    assert Verdict.of(True).score == 1.0 and Verdict.of(False, "x").detail == "x"
    with pytest.raises(ValueError):
        Verdict(passed=True, score=1.5)


async def test_exact_verifier() -> None:
    v = ExactVerifier()
    assert (await v.verify(TASK, " $1,000. ", "1000")).passed
    assert (await v.verify(TASK, "PARIS", "paris")).passed
    assert not (await v.verify(TASK, "1001", "1000")).passed
    assert not (await ExactVerifier(case_sensitive=True).verify(TASK, "PARIS", "paris")).passed
    assert not (await ExactVerifier(normalize=False).verify(TASK, "$1,000", "1000")).passed
    assert (await ExactVerifier(normalize=False).verify(TASK, " x ", "x")).passed
    assert (await ExactVerifier(extract=True).verify(TASK, "so \\boxed{12}", "12")).passed
    assert not (await v.verify(TASK, "", "")).passed  # empty gold never matches
    with pytest.raises(InvalidRequestError):
        await v.verify(TASK, "1")


async def test_regex_verifier() -> None:
    yes = RegexVerifier(r"\b(?:yes|true)\b", ignore_case=True)
    assert (await yes.verify(TASK, "Well... YES.")).passed
    assert not (await yes.verify(TASK, "yesterday")).passed
    full = RegexVerifier(r"\d{3}-\d{4}", fullmatch=True)
    assert (await full.verify(TASK, " 555-1234\n")).passed
    assert not (await full.verify(TASK, "call 555-1234")).passed
    # pattern from the task, else from the gold
    meta = Task.from_prompt("q", metadata={"pattern": r"^4$"})
    assert (await RegexVerifier().verify(meta, "4")).passed
    assert (await RegexVerifier().verify(TASK, "abc42", gold=r"\d+")).passed
    with pytest.raises(InvalidRequestError):
        RegexVerifier("(unclosed")
    with pytest.raises(InvalidRequestError):
        await RegexVerifier().verify(TASK, "x")


async def test_regex_catastrophic_backtracking_times_out() -> None:
    pytest.importorskip("regex")
    v = RegexVerifier(r"^(a|aa)+$", timeout=0.2)
    verdict = await v.verify(TASK, "a" * 40 + "!")
    assert not verdict.passed and "timed out" in verdict.detail["reason"]


# -------------------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_math_prints_the_verdict_and_exits_zero() -> None:
    ok = runner.invoke(check_app, ["math", "The answer is \\boxed{\\frac{1}{2}}", "0.5"])
    assert ok.exit_code == 0, ok.output
    body = json.loads(ok.stdout)
    assert body["passed"] is True and body["score"] == 1.0
    assert body["detail"]["extracted"] == "\\frac{1}{2}"
    bad = runner.invoke(check_app, ["math", "3", "4"])
    assert bad.exit_code == 0 and json.loads(bad.stdout)["passed"] is False


def test_cli_bad_usage_exits_two(tmp_path: Path) -> None:
    assert runner.invoke(check_app, ["math", "3"]).exit_code == 2
    assert runner.invoke(check_app, ["code", str(tmp_path / "missing.py"),
                                     "--tests", str(tmp_path / "t.py")]).exit_code == 2
    cand = tmp_path / "c.py"
    cand.write_text("x = 1\n")
    assert runner.invoke(check_app, ["code", str(cand)]).exit_code == 2  # --tests missing
    assert runner.invoke(check_app, ["nope"]).exit_code == 2


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_cli_code(tmp_path: Path) -> None:
    cand, tests = tmp_path / "cand.py", tmp_path / "tests.py"
    cand.write_text("def add(a, b):\n    return a + b\n")
    tests.write_text("def check(f):\n    assert f(2, 3) == 5\n")
    ok = runner.invoke(check_app, ["code", str(cand), "--tests", str(tests),
                                   "--entry-point", "add"])
    assert ok.exit_code == 0, ok.output
    body = json.loads(ok.stdout)
    assert body["passed"] is True and body["detail"]["sandbox"] == "bwrap"
    cand.write_text("def add(a, b):\n    return a * b\n")
    bad = runner.invoke(check_app, ["code", str(cand), "--tests", str(tests),
                                    "--entry-point", "add"])
    assert bad.exit_code == 0 and json.loads(bad.stdout)["passed"] is False
    # without an entry point the tests run as a script after the code
    tests.write_text("assert add(2, 2) == 4\n")
    script = runner.invoke(check_app, ["code", str(cand), "--tests", str(tests)])
    assert script.exit_code == 0 and json.loads(script.stdout)["passed"] is True
