"""The strategy registry: spec names and aliases -> strategy classes.

A strategy class carries everything the spec language reads (its ``name``,
``Params``, inner counts, default inner strategies, ``worst_case``), so the
registry only lists the classes, each with the other names a spec may call it
by. Adding a strategy is its file, its import here and its line in
:data:`STRATEGIES` (and its row in the README's strategies table, which a test
holds to the registry).

Example:
    >>> REGISTRY["self_consistency"].name
    'sc'
    >>> build("sc(cot, n=4)").params.n
    4
    >>> next(d for d in describe() if d["name"] == "beam")["params"]["scorer"]["type"]
    'str (registered: arith, judge, prm)'
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import networkx as nx

from refinery.strategies.adaptive_sc import AdaptiveSelfConsistency
from refinery.strategies.auto import Auto
from refinery.strategies.base import Strategy
from refinery.strategies.beam import BeamSearch
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cascade import Cascade
from refinery.strategies.cot import INSTRUCTION as COT_INSTRUCTION
from refinery.strategies.cot import CoT
from refinery.strategies.cot_reflection import CoTReflection
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.deepconf import DeepConf
from refinery.strategies.dei import DEI
from refinery.strategies.dvts import DVTS
from refinery.strategies.early_exit import EarlyExit
from refinery.strategies.force_thinking import ForceThinking
from refinery.strategies.genselect import GenSelect
from refinery.strategies.mcts import MCTS
from refinery.strategies.memory import Memory
from refinery.strategies.moa import MoA
from refinery.strategies.particle import ParticleFilter
from refinery.strategies.pot import ProgramOfThought
from refinery.strategies.re2 import ReRead
from refinery.strategies.sage import SAGE
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.self_debug import SelfDebug
from refinery.strategies.spec import DEFAULT_MAX_CALLS, build_strategy, type_name
from refinery.strategies.ssr import SSR
from refinery.strategies.ssr_ada import SSRAda
from refinery.strategies.ssr_plan import SSRPlan
from refinery.strategies.tir import ToolIntegratedReasoning

# Every strategy once, in the order ``refinery strategies`` lists them, with its aliases.
STRATEGIES: tuple[tuple[type[Strategy], tuple[str, ...]], ...] = (
    (CoT, ("chain_of_thought",)),
    (SelfConsistency, ("self_consistency",)),
    (AdaptiveSelfConsistency, ("adaptive_sc", "adaptive_consistency")),
    (BestOfN, ("bon",)),
    (CritiqueRefine, ("critique",)),
    (SSR, ("socratic_self_refine",)),
    (SSRAda, ()),
    (SSRPlan, ()),
    (SAGE, ()),
    (DEI, ("committee",)),
    (MoA, ("mixture_of_agents",)),
    (GenSelect, ("generative_select",)),
    (ReRead, ("reread", "re_reading")),
    (CoTReflection, ()),
    (DeepConf, ()),
    (ForceThinking, ("budget_forcing",)),
    (EarlyExit, ("deer",)),
    (ProgramOfThought, ("program_of_thought", "pal")),
    (SelfDebug, ("self_debugging",)),
    (ToolIntegratedReasoning, ("tool_integrated_reasoning",)),
    (BeamSearch, ("beam_search",)),
    (DVTS, ("diverse_verifier_tree_search",)),
    (ParticleFilter, ("particle_filtering", "pf")),
    (MCTS, ("monte_carlo_tree_search",)),
    (Memory, ("procedural_memory",)),
    (Cascade, ()),
    (Auto, ()),
)

# Read-only: name or alias -> class.
REGISTRY: MappingProxyType[str, type[Strategy]] = MappingProxyType(
    {key: cls for cls, aliases in STRATEGIES for key in (cls.name, *aliases)})


def build_with_graph(spec: str, *, max_calls: int | None = DEFAULT_MAX_CALLS,
                     **limits: int) -> tuple[Strategy, nx.DiGraph]:
    """Parse, validate and instantiate a spec with this registry: ``(strategy, graph)``.

    Raises:
        SpecError: bad spec (unknown name, bad parameter, disallowed syntax, limits).
        BudgetError: worst-case calls above ``max_calls``.
    """
    return build_strategy(spec, REGISTRY, max_calls=max_calls, **limits)


Auto.build_spec = staticmethod(build_with_graph)  # auto builds its candidates' specs here


def build(spec: str, *, max_calls: int | None = DEFAULT_MAX_CALLS, **limits: int) -> Strategy:
    """The strategy a spec describes, e.g. ``build("dei(ssr, sage(cot), votes=5)")``."""
    return build_with_graph(spec, max_calls=max_calls, **limits)[0]


def tool_turn_form(strategy: Strategy) -> Strategy:
    """The strategy that solves a turn whose answer may be a tool call.

    Every sample of such a turn is drawn under the tool-call constraint, so only a
    strategy whose answer is one of its samples, chosen by votes or scores over the
    calls, can act on it (``tool_turns``: cot, sc, best_of_n, deepconf, asc). Any other
    runs the turn as its first inner strategy's form, and one with none as ``cot``; an
    acting strategy gets its inner strategies' forms. A cot asks for no step-by-step
    ``\\boxed{}`` answer there (the tools' instructions say how to answer).

    Example:
        >>> tool_turn_form(build("sc(ssr(cot), n=4)")), tool_turn_form(build("pot"))
        (sc(cot(instruction=''), n=4), cot(instruction=''))
    """
    if type(strategy) is CoT and strategy.params.instruction == COT_INSTRUCTION:
        return CoT.from_validated((), strategy.params.model_copy(update={"instruction": ""}))
    if not strategy.tool_turns:
        return tool_turn_form(strategy.inner[0]) if strategy.inner else tool_turn_form(CoT())
    inner = [tool_turn_form(s) for s in strategy.inner]
    if all(a is b for a, b in zip(inner, strategy.inner, strict=True)):
        return strategy
    return type(strategy).from_validated(inner, strategy.params)


def describe() -> list[dict[str, Any]]:
    """Every strategy with its parameters and defaults, in registry order (for
    ``refinery strategies``)."""
    return [_describe(cls, aliases) for cls, aliases in STRATEGIES]


def _describe(cls: type[Strategy], aliases: tuple[str, ...]) -> dict[str, Any]:
    hi = "any" if cls.max_inner is None else cls.max_inner
    return {
        "name": cls.name, "aliases": list(aliases),
        "inner": cls.min_inner if cls.min_inner == hi else f"{cls.min_inner}..{hi}",
        "default_inner": [c.name for c in cls.default_inner],
        "params": {k: {"type": type_name(f.rebuild_annotation()),
                       "default": f.default, "description": f.description or ""}
                   for k, f in cls.Params.model_fields.items()},
        "doc": (cls.__doc__ or "").strip().splitlines()[0],
        # False: a turn whose answer may be a tool call runs as its tool-turn form
        "tool_turns": cls.tool_turns,
    }
