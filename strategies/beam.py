"""Beam search over solution steps, guided by a step scorer."""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from refinery.strategies.spec import ChildCost
from refinery.strategies.step_search import SearchParams, StepPath, StepSearch


class BeamSearch(StepSearch):
    """``beam(scorer="arith", width=4, expand=4)``: the ``width`` best partial solutions
    go on, each grown by ``expand`` sampled next steps.

    The first level draws ``width * expand`` first steps in one request; at each
    level every kept path draws ``expand`` next steps, the step scorer scores
    them, and the ``width`` best live paths (by their aggregated scores) are
    kept, the rest pruned. A path that states its answer leaves the beam for the
    answer pool, so the beam narrows as paths finish. The answer is the best
    finished path.

    Source: the beam search of Snell et al. 2024, "Scaling LLM Test-Time Compute
    Optimally can be More Effective than Scaling Model Parameters", as in Hugging
    Face's search-and-learn.

    Example:
        >>> beam = BeamSearch(scorer="arith", width=2, expand=2)
        >>> attempt = await beam.solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["steps"], attempt.answer  # doctest: +SKIP
        (3, '14')
    """

    name = "beam"

    class Params(SearchParams):
        width: int = Field(4, ge=1, le=32, description="partial solutions kept a level")
        expand: int = Field(4, ge=1, le=32, description="next steps drawn for each")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        judged = params.width * params.expand if params.scorer == "judge" else 0
        return 1 + (params.max_steps - 1) * params.width + params.max_steps * judged + 1

    def fanout(self, level: int) -> int:
        return self.params.width * self.params.expand if level == 0 else self.params.expand

    def select(self, population: list[StepPath], rng: random.Random) -> list[int]:
        how = self.params.aggregate
        ranked = sorted(range(len(population)), key=lambda i: -population[i].value(how))
        return sorted(ranked[: self.params.width])
