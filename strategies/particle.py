"""Particle filtering over solution steps: particles resampled by their step rewards."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from refinery.strategies.spec import ChildCost
from refinery.strategies.step_search import SearchParams, StepPath, StepSearch


def softmax(values: Sequence[float], temperature: float) -> list[float]:
    """Weights proportional to ``exp(value / temperature)``."""
    top = max(values)
    exps = [math.exp((v - top) / temperature) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def systematic(weights: Sequence[float], n: int, rng: random.Random) -> list[int]:
    """``n`` indices drawn with one uniform offset: lower variance than multinomial."""
    start, out, cum, i = rng.random() / n, [], weights[0], 0
    for k in range(n):
        u = start + k / n
        while u > cum and i < len(weights) - 1:
            i += 1
            cum += weights[i]
        out.append(i)
    return out


class ParticleFilter(StepSearch):
    """``particle(scorer="arith", n=8)``: ``n`` particles, one step a level, resampled.

    Every live particle draws one next step; the scorer scores it; then all ``n``
    particles (finished ones included, carried as they are) are resampled with
    weights ``softmax(reward / resample_temperature)``, so likely-right partial
    solutions are copied and unlikely ones die out while sampling keeps some
    diversity. A finished particle draws no more steps. The search ends when
    every particle has finished; the answer is the finished particle with the
    highest reward.

    Source: Puri et al. 2025, "A Probabilistic Inference Approach to
    Inference-Time Scaling of LLMs using Particle-Based Monte Carlo Methods".

    Example:
        >>> attempt = await ParticleFilter(scorer="arith", n=4).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.answer  # doctest: +SKIP
        '14'
    """

    name = "particle"
    carries_finished = True

    class Params(SearchParams):
        n: int = Field(8, ge=1, le=128, description="particles")
        resample_temperature: float = Field(1.0, gt=0.0, le=100.0,
                                            description="softmax temperature of the rewards")
        resampling: Literal["multinomial", "systematic"] = "systematic"
        seed: int = Field(0, description="seed of the resampling draws")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        judged = params.n if params.scorer == "judge" else 0
        return 1 + (params.max_steps - 1) * params.n + params.max_steps * judged + 1

    def fanout(self, level: int) -> int:
        return self.params.n if level == 0 else 1

    def select(self, population: list[StepPath], rng: random.Random) -> list[int]:
        p = self.params
        weights = softmax([g.value(p.aggregate) for g in population], p.resample_temperature)
        if p.resampling == "multinomial":
            return sorted(rng.choices(range(len(population)), weights=weights, k=p.n))
        return systematic(weights, p.n, rng)
