"""The strategy registry: name (and aliases) -> entry, as ``refinery.strategies.spec`` expects.

Each entry exposes the class, its Params model, how many inner strategies it
takes (positional arguments in a spec), its default inner strategies, and its
worst-case call count as a function of its params and its children's worst
cases. All of it is read off the strategy class, so a strategy is described
in one place.

Example:
    >>> REGISTRY["self_consistency"].name
    'sc'
    >>> build("sc(cot, n=4)").params.n
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import networkx as nx
from pydantic import BaseModel

from refinery.strategies.spec import DEFAULT_MAX_CALLS, ChildCost, build_strategy, type_name
from refinery.strategies.adaptive_sc import AdaptiveSelfConsistency
from refinery.strategies.base import Strategy
from refinery.strategies.beam import BeamSearch
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cot import CoT
from refinery.strategies.cot_reflection import CoTReflection
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.deepconf import DeepConf
from refinery.strategies.dei import DEI
from refinery.strategies.dvts import DVTS
from refinery.strategies.memory import Memory
from refinery.strategies.moa import MoA
from refinery.strategies.particle import ParticleFilter
from refinery.strategies.pot import ProgramOfThought
from refinery.strategies.re2 import ReRead
from refinery.strategies.sage import SAGE
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.self_debug import SelfDebug
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.strategies.ssr_plan import SSRPlan
from refinery.strategies.tir import ToolIntegratedReasoning


@dataclass(frozen=True)
class Entry:
    """One registered strategy."""

    cls: type[Strategy]
    aliases: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def params(self) -> type[BaseModel]:
        return self.cls.Params

    @property
    def min_inner(self) -> int:
        return self.cls.min_inner

    @property
    def max_inner(self) -> int | None:
        return self.cls.max_inner

    @property
    def default_inner(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.cls.default_inner)

    @property
    def samples_in_one_request(self) -> bool:
        # the test cot.sample_inner makes: a cot variant samples n attempts in one request
        return issubclass(self.cls, CoT)

    def worst_case(self, params: BaseModel, children: Sequence[ChildCost]) -> int:
        return self.cls.worst_case(params, children)

    def build(self, inner: Sequence[Strategy], params: BaseModel) -> Strategy:
        return self.cls.from_validated(inner, params)

    def describe(self) -> dict[str, Any]:
        """Name, aliases, inner strategies and parameters (for ``refinery strategies``)."""
        hi = "any" if self.max_inner is None else self.max_inner
        return {
            "name": self.name, "aliases": list(self.aliases),
            "inner": self.min_inner if self.min_inner == hi else f"{self.min_inner}..{hi}",
            "default_inner": list(self.default_inner),
            "params": {k: {"type": type_name(f.annotation),
                           "default": f.default, "description": f.description or ""}
                       for k, f in self.params.model_fields.items()},
            "doc": (self.cls.__doc__ or "").strip().splitlines()[0],
        }


ENTRIES: tuple[Entry, ...] = (
    Entry(CoT, ("chain_of_thought",)),
    Entry(SelfConsistency, ("self_consistency",)),
    Entry(AdaptiveSelfConsistency, ("adaptive_sc", "adaptive_consistency")),
    Entry(BestOfN, ("bon",)),
    Entry(CritiqueRefine, ("critique",)),
    Entry(SSR, ("socratic_self_refine",)),
    Entry(SSRAda),
    Entry(SSRPlan),
    Entry(SAGE),
    Entry(DEI, ("committee",)),
    Entry(MoA, ("mixture_of_agents",)),
    Entry(ReRead, ("reread", "re_reading")),
    Entry(CoTReflection),
    Entry(DeepConf),
    Entry(ProgramOfThought, ("program_of_thought", "pal")),
    Entry(SelfDebug, ("self_debugging",)),
    Entry(ToolIntegratedReasoning, ("tool_integrated_reasoning",)),
    Entry(BeamSearch, ("beam_search",)),
    Entry(DVTS, ("diverse_verifier_tree_search",)),
    Entry(ParticleFilter, ("particle_filtering", "pf")),
    Entry(Memory, ("procedural_memory",)),
)

# Read-only: name or alias -> entry.
REGISTRY = MappingProxyType({key: e for e in ENTRIES for key in (e.name, *e.aliases)})


def build_with_graph(spec: str, *, max_calls: int | None = DEFAULT_MAX_CALLS,
                     **limits: int) -> tuple[Strategy, nx.DiGraph]:
    """Parse, validate and instantiate a spec with this registry: ``(strategy, graph)``.

    Raises:
        SpecError: bad spec (unknown name, bad parameter, disallowed syntax, limits).
        BudgetError: worst-case calls above ``max_calls``.
    """
    return build_strategy(spec, REGISTRY, max_calls=max_calls, **limits)


def build(spec: str, *, max_calls: int | None = DEFAULT_MAX_CALLS, **limits: int) -> Strategy:
    """The strategy a spec describes, e.g. ``build("dei(ssr, sage(cot), votes=5)")``."""
    return build_with_graph(spec, max_calls=max_calls, **limits)[0]


def describe() -> list[dict[str, Any]]:
    """Every strategy with its parameters and defaults, in registry order."""
    return [e.describe() for e in ENTRIES]
