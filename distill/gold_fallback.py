"""Reference solutions as SFT rows: a documented fallback, never the default.

When a model solves too few training problems to exercise the pipeline, ``arith``
problems' operation trails give worked solutions; their rows say
``step="gold_solution"`` and ``verifier="gold"``, so they are never mistaken for
the model's own verified attempts.

Example:
    >>> from refinery.eval.arith import load_arith
    >>> rows = gold_sft_rows(load_arith("train", limit=8))
    >>> rows[0].metadata.verifier, rows[0].metadata.step
    ('gold', 'gold_solution')
    >>> rows[0].messages[-1].content
    'Emma starts with 8.\\n8 - 2 = 6.\\nThe answer is \\\\boxed{6}.'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from refinery.distill.candidates import Candidate, Problem, normalized
from refinery.distill.schema import (
    MessagesRow,
    PromptCompletionRow,
    SFTFormat,
)
from refinery.distill.selection import provenance, sft_row

__all__ = ["arith_solution", "gold_sft_rows"]

_START = re.compile(r"\bhas (\d+) ")


def arith_solution(prompt: str, steps: Sequence[str], gold: str) -> str | None:
    """A worked solution of an ``arith`` problem from its operation trail, or ``None``.

    Example:
        >>> arith_solution("Ava has 5 apples. Ava buys 3 more apples. How many ...?",
        ...                ["+3"], "8")
        'Ava starts with 5.\\n5 + 3 = 8.\\nThe answer is \\\\boxed{8}.'
    """
    m = _START.search(prompt)
    if not m:
        return None
    value = int(m.group(1))
    name = prompt.split(" has ", 1)[0].strip()
    lines = [f"{name} starts with {value}."]
    for s in steps:
        op, k = s[0], int(s[1:])
        new = {"+": value + k, "-": value - k, "*": value * k,
               "/": value // k if k else value}[op]
        sym = {"+": "+", "-": "-", "*": "×", "/": "÷"}[op]
        lines.append(f"{value} {sym} {k} = {new}.")
        value = new
    if str(value) != str(gold).strip():
        return None
    lines.append(f"The answer is \\boxed{{{value}}}.")
    return "\n".join(lines)


def gold_sft_rows(examples: Iterable[Any], *, instruction: str | None = None,
                  sft_format: SFTFormat = "messages", source: str = "gold",
                  weight: float = 1.0) -> list[MessagesRow | PromptCompletionRow]:
    """SFT rows from reference solutions of ``arith`` examples (``refinery.eval.datasets.Example``).

    Used only as a documented fallback when a model solves too few training problems
    to exercise the pipeline; rows say ``step="gold_solution"``, ``verifier="gold"``.
    """
    rows: list[MessagesRow | PromptCompletionRow] = []
    for ex in examples:
        steps = (getattr(ex, "private", {}) or {}).get("steps")
        if not steps or ex.gold is None:
            continue
        text = arith_solution(ex.prompt, steps, ex.gold)
        if text is None:
            continue
        prob = Problem(key=normalized(ex.prompt), prompt=ex.prompt, problem_id=ex.id,
                        dataset=ex.dataset, level=ex.level)
        c = Candidate(problem_id=ex.id, run=source, raw=text, step="gold_solution",
                      strategy="gold", text=text, answer=str(ex.gold), verifier="gold")
        rows.append(sft_row(prob, c, provenance(prob, c, weight, False, False),
                             instruction, sft_format))
    return rows
