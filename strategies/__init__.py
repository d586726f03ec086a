"""Refinement strategies as composable combinators, and their registry.

The package names what writing and building strategies takes: the base classes
and the registry. A strategy class is imported from its own module
(``from refinery.strategies.cot import CoT``) or built from a spec.

Example:
    >>> from refinery import strategies
    >>> strategies.build("dei(ssr, critique_refine(rounds=2), sage(cot), votes=5)")
    dei(ssr(cot), critique_refine(cot), sage(cot), votes=5)
    >>> strategies.REGISTRY["cot"].__name__
    'CoT'
"""

from refinery.strategies.base import (
    LoopStrategy,
    Sampler,
    Scored,
    Strategy,
    StrategyParams,
    StructuredParams,
)
from refinery.strategies.registry import REGISTRY, STRATEGIES, build, build_with_graph, describe

__all__ = [
    "REGISTRY",
    "STRATEGIES",
    "LoopStrategy",
    "Sampler",
    "Scored",
    "Strategy",
    "StrategyParams",
    "StructuredParams",
    "build",
    "build_with_graph",
    "describe",
]
