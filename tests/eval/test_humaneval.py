"""HumanEval through the scorer and the sandboxed code verifier: canonical solutions pass."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from refinery.eval.datasets import load_humaneval
from refinery.eval.metrics import Scorer, mean_pass_at_k

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


async def test_humaneval_canonical_solutions_score_pass_at_1_of_100_percent() -> None:
    exs = load_humaneval()
    assert len(exs) == 164
    scorer = Scorer()
    scores = await asyncio.gather(*(scorer.score(e, e.gold) for e in exs))
    failed = [(e.id, s.detail) for e, s in zip(exs, scores, strict=True) if not s.passed]
    assert failed == []
    assert all(s.detail["sandbox"] == "bwrap" for s in scores)
    assert mean_pass_at_k([(1, int(s.passed)) for s in scores], 1) == 1.0


async def test_humaneval_chat_style_answers_and_wrong_code() -> None:
    exs = load_humaneval(limit=8)
    scorer = Scorer()
    # a chat model answers with the whole function in a fenced block
    fenced = [f"Here you go:\n```python\n{e.private['prompt']}{e.gold}```\n" for e in exs]
    ok = await asyncio.gather(*(scorer.score(e, t) for e, t in zip(exs, fenced, strict=True)))
    assert all(s.passed for s in ok)
    assert ok[0].prediction.startswith("from typing import List")
    wrong = await asyncio.gather(*(scorer.score(e, "    return None\n") for e in exs))
    assert not any(s.passed for s in wrong)
