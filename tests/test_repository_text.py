"""The repository speaks of the project, not of how it was built.

Every tracked text file is searched for the vocabulary of a work log: numbered
work sessions, issue numbers, goals met or missed. HTTP sessions, pytest's
session scope, ``ClientSession`` and a chat's user or assistant turn are not
matched: the patterns need a number, a goal, or a word that places a session in
time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WORK_LOG = re.compile(
    "|".join((
        r"\bsessions?[ -]\d+",
        r"\b(?:this|that|a later|the next|another|the previous|a previous|an earlier|earlier"
        r"|later|same|one|each) session\b(?! scope)",
        r"\bsession (?:before|after|had)\b",
        r"\bend of a session\b",
        r"\bissues? #?\d+",
        r"\(#\d+\)",
        r"\btargets?\b[^.\n]{0,40}\b(?:missed|met)\b",
        r"\btargets?\s*(?:<=|>=|<|>|=)\s*\d",
        r"\b(?:this|last|next|previous) turn\b",
    )),
    re.IGNORECASE,
)

# Recorded data (model generations, datasets) is not the project's prose, and this
# file quotes the wording it looks for.
SKIPPED = (re.compile(r"^data/.*\.jsonl$"), re.compile(r"\.(png|jpg|gguf|ico|woff2?)$"),
           re.compile(r"^tests/test_repository_text\.py$"))


def work_log_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of ``text`` that reads like a work log."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if WORK_LOG.search(line)]


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [ROOT / name for name in out.split("\0")
            if name and not any(p.search(name) for p in SKIPPED)]


@pytest.mark.parametrize("line", [
    "measured in session 21 on the EPYC", "as issue #17 asks", "(target <= 0.5: missed)",
    "the target (>= 95%) is missed", "a later session will rerun it", "fixed (#20)",
    "stopped at the end of a session", "more than the session had left", "this turn",
])
def test_work_log_wording_is_found(line):
    assert work_log_lines(f"intro\n{line}\n") == [(2, line)]


@pytest.mark.parametrize("line", [
    "async with aiohttp.ClientSession() as session:", "a session-scoped fixture",
    "@pytest.fixture(scope='session')", "the user turn, then the assistant turn",
    "setsid puts the child in its own session", "the training target of a round",
    "make test's targets", "an HTTP session cookie",
])
def test_ordinary_wording_is_not_found(line):
    assert work_log_lines(line) == []


def test_no_tracked_file_reads_like_a_work_log():
    found = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        found += [f"{path.relative_to(ROOT)}:{n}: {line}" for n, line in work_log_lines(text)]
    assert not found, "work-log wording in the repository:\n" + "\n".join(found)
