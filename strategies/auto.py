"""auto: each question to the candidate strategy a tuned profile's router picks for it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from pydantic import Field

from refinery.engine.context import Context
from refinery.engine.errors import InvalidRequestError, SpecError
from refinery.engine.types import Attempt, Task
from refinery.strategies.base import Strategy, StrategyParams
from refinery.strategies.profile import Candidate, Profile
from refinery.strategies.spec import ChildCost


def _load(params: Auto.Params) -> Profile:
    try:
        return Profile.load(params.profile)
    except InvalidRequestError as exc:
        raise SpecError(f"auto: {exc.message}") from None


class Auto(Strategy):
    """``auto(profile="DIR", level="router")``: the strategy a profile picks per question.

    ``refinery tune`` writes ``DIR/profile.json``: candidates (a spec and the run
    temperature measured), their dev accuracy and cost, effort levels on the
    accuracy-tokens frontier, and a router. With ``level="router"`` each question's
    cheap features (length, its numbers, operation words, code and math marks) give
    each candidate's predicted chance to solve it, and the question goes to the
    cheapest candidate whose chance reaches the profile's target accuracy; where
    none does (the router is unsure), to the profile's fallback (a cascade if it was
    a candidate, else the ``high`` level). ``level="low"|"medium"|"high"`` runs that
    level's candidate on every question. The chosen candidate runs as this node
    would (its final answer streams at the root), at its own temperature; the
    choice is a ``select`` event of the trace and ``metadata["auto"]``.

    Example:
        >>> auto = Auto(profile="profiles/arith")
        >>> attempt = await auto.solve(Task.from_prompt("Emma has 8 ..."), ctx)  # doctest: +SKIP
        >>> attempt.metadata["auto"]  # doctest: +SKIP
        {'candidate': 'cot', 'temperature': 0.0, 'level': 'router', 'chance': 0.91}
    """

    name = "auto"
    # How a candidate's spec becomes a strategy and its graph: the registry's builder,
    # which strategies/registry.py sets when it registers this class (the registry
    # imports every strategy, so a strategy cannot import it back).
    build_spec: ClassVar[Callable[[str], tuple[Strategy, Any]] | None] = None

    class Params(StrategyParams):
        profile: str = Field(..., description="profile directory written by refinery tune")
        level: Literal["router", "low", "medium", "high"] = Field(
            "router", description="router: per question; else that effort level always")

    @staticmethod
    def worst_case(params: Params, children: Sequence[ChildCost]) -> int:
        specs = {c.candidate.spec for c in _load(params).candidates}
        return max(Auto.built(s)[1].graph["worst_case_calls"] for s in specs)

    @staticmethod
    def built(spec: str) -> tuple[Strategy, Any]:
        """``spec`` built by the registry's builder: ``(strategy, graph)``."""
        if Auto.build_spec is None:
            raise SpecError("auto needs the strategy registry (refinery.strategies.registry)")
        return Auto.build_spec(spec)

    def choose(self, profile: Profile, question: str) -> tuple[int, float | None]:
        """The candidate index for ``question`` and, when routed, its predicted chance."""
        if self.params.level != "router":
            return profile.levels[self.params.level], None
        if profile.router is None:  # too few dev problems to fit one
            return profile.fallback, None
        index = profile.router.choose(question)
        return index, round(profile.router.chances(question)[index], 4)

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        profile = _load(self.params)
        index, chance = self.choose(profile, task.question)
        candidate: Candidate = profile.candidates[index].candidate
        choice = {"candidate": candidate.spec, "temperature": candidate.temperature,
                  "level": self.params.level, "chance": chance}
        ctx.emit("select", candidate.spec, strategy=self.name, **choice)
        run_ctx = ctx.fork(params=ctx.params.but(temperature=candidate.temperature))
        attempt = await Auto.built(candidate.spec)[0].solve(task, run_ctx)
        return attempt.model_copy(update={"metadata": {**attempt.metadata, "auto": choice}})
