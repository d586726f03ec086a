"""Refinement strategies as composable combinators, and their registry.

Example:
    >>> import strategies
    >>> s = strategies.build("dei(ssr, critique_refine(rounds=2), sage(cot), votes=5)")
    >>> attempt = await s.solve(task, ctx)
"""

from strategies.base import LoopStrategy, Scored, Strategy, StrategyParams
from strategies.best_of_n import BestOfN
from strategies.cot import CoT
from strategies.critique_refine import CritiqueRefine
from strategies.dei import DEI
from strategies.registry import REGISTRY, Entry, build, build_with_graph, describe
from strategies.sage import SAGE
from strategies.self_consistency import SelfConsistency
from strategies.ssr import SSR
from strategies.ssr_ada import SSRAda
from strategies.ssr_plan import SSRPlan

__all__ = [
    "DEI",
    "REGISTRY",
    "SAGE",
    "SSR",
    "BestOfN",
    "CoT",
    "CritiqueRefine",
    "Entry",
    "LoopStrategy",
    "SSRAda",
    "SSRPlan",
    "Scored",
    "SelfConsistency",
    "Strategy",
    "StrategyParams",
    "build",
    "build_with_graph",
    "describe",
]
