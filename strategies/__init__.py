"""Refinement strategies as composable combinators, and their registry.

Example:
    >>> from refinery import strategies
    >>> s = strategies.build("dei(ssr, critique_refine(rounds=2), sage(cot), votes=5)")
    >>> attempt = await s.solve(task, ctx)
"""

from refinery.strategies.adaptive_sc import AdaptiveSelfConsistency
from refinery.strategies.base import (
    LoopStrategy,
    Sampler,
    Scored,
    Strategy,
    StrategyParams,
    StructuredParams,
)
from refinery.strategies.beam import BeamSearch
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cot import CoT
from refinery.strategies.cot_reflection import CoTReflection
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.deepconf import DeepConf
from refinery.strategies.dei import DEI
from refinery.strategies.dvts import DVTS
from refinery.strategies.memory import Memory
from refinery.strategies.memory_store import MemoryStore
from refinery.strategies.moa import MoA
from refinery.strategies.particle import ParticleFilter
from refinery.strategies.pot import ProgramOfThought
from refinery.strategies.re2 import ReRead
from refinery.strategies.registry import REGISTRY, Entry, build, build_with_graph, describe
from refinery.strategies.sage import SAGE
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.self_debug import SelfDebug
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.strategies.ssr_plan import SSRPlan
from refinery.strategies.tir import ToolIntegratedReasoning

__all__ = [
    "DEI",
    "DVTS",
    "REGISTRY",
    "SAGE",
    "SSR",
    "AdaptiveSelfConsistency",
    "BeamSearch",
    "BestOfN",
    "CoT",
    "CoTReflection",
    "CritiqueRefine",
    "DeepConf",
    "Entry",
    "LoopStrategy",
    "Memory",
    "MemoryStore",
    "MoA",
    "ParticleFilter",
    "ProgramOfThought",
    "ReRead",
    "SSRAda",
    "SSRPlan",
    "Sampler",
    "Scored",
    "SelfConsistency",
    "SelfDebug",
    "Strategy",
    "StrategyParams",
    "StructuredParams",
    "ToolIntegratedReasoning",
    "build",
    "build_with_graph",
    "describe",
]
