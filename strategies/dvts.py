"""Diverse verifier tree search: independent subtrees, each searched greedily."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field, model_validator

from refinery.strategies.spec import ChildCost
from refinery.strategies.step_search import SearchParams, StepPath, StepSearch


class DVTS(StepSearch):
    """``dvts(scorer="arith", n=16, width=4)``: ``n / width`` subtrees searched apart.

    Each subtree starts from its own first step; at every level its one live path
    draws ``width`` next steps and keeps the best-scored one. Subtrees never
    compete with each other, so one strong early step cannot take over the
    whole search (the collapse beam search shows at large widths). The answer
    is the best finished path of any subtree.

    Source: Beeching, Tunstall and Rush 2024, "Scaling test-time compute with open
    models" (Hugging Face's search-and-learn).

    Example:
        >>> attempt = await DVTS(scorer="arith", n=8, width=4).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["finished"]  # doctest: +SKIP
        2
    """

    name = "dvts"

    class Params(SearchParams):
        n: int = Field(16, ge=1, le=128, description="steps drawn a level, over all subtrees")
        width: int = Field(4, ge=1, le=32, description="next steps each subtree draws")

        @model_validator(mode="after")
        def _divides(self):
            if self.n % self.width:
                raise ValueError(f"n ({self.n}) must be a multiple of width ({self.width})")
            return self

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        trees = params.n // params.width
        judged = params.n if params.scorer == "judge" else 0
        return 1 + (params.max_steps - 1) * trees + params.max_steps * judged + 1

    def fanout(self, level: int) -> int:
        # One request of n first steps; each becomes the root of its subtree below.
        return self.params.n // self.params.width if level == 0 else self.params.width

    def select(self, population: list[StepPath], rng: random.Random) -> list[int]:
        how, best = self.params.aggregate, {}
        for i, path in enumerate(population):
            if path.group not in best or path.value(how) > population[best[path.group]].value(how):
                best[path.group] = i
        return sorted(best.values())
