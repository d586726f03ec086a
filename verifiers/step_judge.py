"""A generative process reward: the model itself asked whether a step is correct.

For each new step, the judge sees the question, the steps before it and the
step, and answers ``Yes`` or ``No`` in one constrained token; the score is
P(Yes) read from that token's top log-probabilities, normalised over the two
answers. All new steps of a level go to the engine at once, so they batch.
Earlier steps keep the score they got when they were new.

Example:
    >>> scorer = JudgeStepScorer()
    >>> await scorer.score(task, [["3 + 4 = 7."], ["3 + 4 = 8."]], ctx)  # doctest: +SKIP
    [[0.81], [0.34]]
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from refinery.engine.constraints import Constraint, structured_mode
from refinery.engine.context import Context
from refinery.engine.types import Completion, Message, SamplingParams, Task

__all__ = ["JUDGE_PROMPT", "JudgeStepScorer", "p_yes"]

JUDGE_PROMPT = ("Question: {question}\n\nSolution so far:\n{before}\n\nNext step:\n{step}\n\n"
                "Is the next step correct? Answer Yes or No.")
ANSWERS = ("Yes", "No")
# A side of the choice missing from the top log-probabilities is at most this likely.
FLOOR = -20.0


def p_yes(comp: Completion) -> float:
    """P(Yes) / (P(Yes) + P(No)) from the first token's alternatives (0.5 unreadable)."""
    first = (comp.token_logprobs or [None])[0]
    if first is None:
        return 0.5
    seen = {t.token.strip(): t.logprob for t in [first, *first.top_logprobs]}
    yes, no = (max(FLOOR, seen.get(a, FLOOR)) for a in ANSWERS)
    if yes == no == FLOOR:
        return 0.5
    return 1.0 / (1.0 + math.exp(no - yes))


class JudgeStepScorer:
    """``judge``: the served model's P(Yes) that each new step is correct."""

    name = "judge"

    def __init__(self) -> None:
        # Scores of steps already judged in this solve (a search builds one scorer a
        # solve), keyed by the steps up to and including the one judged.
        self._known: dict[tuple[str, ...], float] = {}

    async def score(self, task: Task, paths: Sequence[Sequence[str]],
                    ctx: Context) -> list[list[float]]:
        wanted = {tuple(p[: j + 1]) for p in paths for j in range(len(p))} - set(self._known)
        keys = sorted(wanted, key=len)
        values = await asyncio.gather(*(self._judge(task, k, ctx) for k in keys))
        self._known.update(zip(keys, values, strict=True))
        return [[self._known[tuple(p[: j + 1])] for j in range(len(p))] for p in paths]

    async def _judge(self, task: Task, steps: tuple[str, ...], ctx: Context) -> float:
        prompt = JUDGE_PROMPT.format(question=task.question,
                                     before="\n\n".join(steps[:-1]) or "(nothing yet)",
                                     step=steps[-1])
        # Constrained where the backend can, so the first token is Yes or No; free text
        # elsewhere, its first token read the same way.
        constrained = structured_mode("judge", None, frozenset({"choice"}), ctx.backend)
        params = SamplingParams(
            temperature=0.0, max_tokens=2, logprobs=True, top_logprobs=5,
            constraint=Constraint.one_of(list(ANSWERS)) if constrained else None)
        gen = await ctx.generate([Message(role="user", content=prompt)], params,
                                 step="judge", strategy="judge")
        return p_yes(gen[0])
