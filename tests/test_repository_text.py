"""The repository speaks of the project, not of how it was built, nor of where.

Every tracked text file is searched for the vocabulary of a work log: numbered
work sessions, issue numbers, goals met or missed. HTTP sessions, pytest's
session scope, ``ClientSession`` and a chat's user or assistant turn are not
matched: the patterns need a number, a goal, or a word that places a session in
time. Asides of the lab are searched for too (who directs the work, the build
machine's own disk, the code as it was before a change), and paths of one
machine (a home or work directory, a named file in /tmp): a clone elsewhere has
none of them.
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
        # a chat's turns are "the next turn", "a previous turn": no article, a work turn
        r"(?<!\ba )(?<!\bthe )(?<!\beach )\b(?:this|last|next|previous) turn\b",
    )),
    re.IGNORECASE,
)

LAB_ASIDE = re.compile(
    "|".join((
        r"\bthe lead\b",
        r"\bon local disk\b",
        r"\b(?:before|after|until|since) this change\b",
        r"\bthe (?:old|former) (?:code|regex|scanner|implementation|design|approach|parser)\b",
    )),
    re.IGNORECASE,
)

MACHINE_PATH = re.compile(r"(?<![\w.{}-])(?:/root/|/home/[a-z_][\w.-]*/|/work/|/Users/\w|/tmp/\w)")

# Recorded data (model generations, datasets) is not the project's prose, this
# file quotes the wording it looks for, and the sandbox's hostile programs name
# host paths on purpose (what they try to read or write).
SKIPPED = (re.compile(r"^data/.*\.jsonl$"), re.compile(r"\.(png|jpg|gguf|ico|woff2?)$"),
           re.compile(r"^tests/test_repository_text\.py$"),
           re.compile(r"^tests/verifiers/hostile/"))

# Lines found that stay, each with its reason: (file, a piece of the line).
KEPT = {
    ("pyproject.toml", "(found on local disk here)"):
        "inside the dependency lists whose hash names the venv: rewording it rebuilds "
        "every venv, so it is reworded with the next change of dependencies",
}


def work_log_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) for each line of ``text`` that reads like a work log,
    a lab's aside or names a path of one machine."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if WORK_LOG.search(line) or LAB_ASIDE.search(line) or MACHINE_PATH.search(line)]


def _kept(name: str, line: str) -> bool:
    return any(name == path and piece in line for path, piece in KEPT)


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [ROOT / name for name in out.split("\0")
            if name and not any(p.search(name) for p in SKIPPED)]


@pytest.mark.parametrize("line", [
    "measured in session 21 on the EPYC", "as issue #17 asks", "(target <= 0.5: missed)",
    "the target (>= 95%) is missed", "a later session will rerun it", "fixed (#20)",
    "stopped at the end of a session", "more than the session had left", "this turn",
    "The lead mounts the page", "the CPU build, found on local disk here",
    "a hang guard: the old regex needed 2**29 steps", "Before this change, dei made 3 calls",
    'DATA = Path("/work/shared/data/gsm8k")', "written to /tmp/setup.log",
    "cd /home/alice/refinery", "/root/.cache/refinery/venv-1234/bin/python",
])
def test_work_log_wording_is_found(line):
    assert work_log_lines(f"intro\n{line}\n") == [(2, line)]


@pytest.mark.parametrize("line", [
    "async with aiohttp.ClientSession() as session:", "a session-scoped fixture",
    "@pytest.fixture(scope='session')", "the user turn, then the assistant turn",
    "setsid puts the child in its own session", "the training target of a round",
    "make test's targets", "an HTTP session cookie",
    "what a next turn reads", "the previous turn's tool calls", "where a login should lead",
    "the leading answer", "the old engine's processes are gone",
    "a crash leaves the old file", "~/.cache/refinery", "$REFINERY_HOME/models/<name>",
    "tempfile.mkdtemp() under /tmp", "{{PROJECT}}/pyproject.toml", "a/tmp/x",
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
        name = path.relative_to(ROOT).as_posix()
        found += [f"{name}:{n}: {line}" for n, line in work_log_lines(text)
                  if not _kept(name, line)]
    assert not found, "work-log wording or machine paths in the repository:\n" + "\n".join(found)


def test_every_kept_line_is_still_there():
    gone = [(name, piece) for name, piece in KEPT
            if piece not in (ROOT / name).read_text(encoding="utf-8")]
    assert gone == [], "drop these from KEPT"
