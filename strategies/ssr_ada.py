"""Adaptive SSR: a cheap holistic judge first; decompose only on full marks."""

from __future__ import annotations

from collections.abc import Sequence

from refinery.strategies import socratic
from refinery.strategies.spec import ChildCost
from refinery.strategies.ssr import SSR


class SSRAda(SSR):
    """``ssr_ada(inner, max_iter=3)``: SSR that spends re-solves only where they help.

    Each round a holistic judge scores the trajectory 0-5. Below full marks
    the round is a plain self-refine with the judge's feedback; at full marks
    the trajectory goes through SSR's decomposition and re-solving (Socratic
    refine of the weakest step, or self-refine with the same judge's feedback
    when every step is fully confident). Parameters as ``ssr``.

    Example:
        >>> attempt = await SSRAda(CoT()).solve(task, ctx)  # doctest: +SKIP
        >>> attempt.metadata["mode"]  # doctest: +SKIP
        'self_refine'
    """

    name = "ssr_ada"
    adaptive = True

    @staticmethod
    def worst_case(params: SSR.Params, children: Sequence[ChildCost]) -> int:
        return socratic.worst_case(params, children[0].calls, adaptive=True)
