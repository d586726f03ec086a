"""Budgets end strategies cleanly; traces form a provenance DAG; the registry."""

from __future__ import annotations

import networkx as nx
import pytest

from refinery import strategies
from refinery.engine.context import Budget
from refinery.engine.errors import BudgetExhausted, SpecError
from refinery.engine.run import run, solve_one
from refinery.engine.types import Attempt
from refinery.strategies.base import PartialAttempts, gather_attempts
from refinery.strategies.cot import CoT
from refinery.strategies.critique_refine import CritiqueRefine
from refinery.strategies.dei import DEI
from refinery.strategies.self_consistency import SelfConsistency
from refinery.strategies.ssr import SSR
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import ProbeBackend, ctx, task

LOW = "Correctness: 2\nCompleteness: 2\nReasoning validity: 2\nFormat: 2\nDirective: redo"


async def test_budget_keeps_best_scored_attempt():
    backend = ScriptedBackend([(r"strict examiner", LOW),
                               (r"A reviewer checked", "v2 \\boxed{2}"),
                               (r".*", "v1 \\boxed{1}")])
    attempt = await CritiqueRefine(CoT(), rounds=2).solve(task(), ctx(backend, max_calls=3))
    # draft, critique, refine fit; the refinement's critique does not: the scored draft wins
    assert len(backend.calls) == 3 and attempt.text == "v1 \\boxed{1}"
    assert attempt.metadata["stopped"] == "budget"
    assert "call budget of 3 spent" in attempt.metadata["budget_exhausted"]


async def test_budget_inside_inner_strategies_propagates_to_metadata():
    # the probe interleaves the three inner runs as vLLM would: drafts first
    backend = ProbeBackend([(r"strict examiner", LOW), (r".*", "\\boxed{4}")])
    sc = SelfConsistency(CritiqueRefine(CoT(), rounds=1), n=3)
    attempt = await sc.solve(task(), ctx(backend, max_calls=4))
    # admission counts the calls in flight, so the concurrent runs cannot overshoot
    assert len(backend.calls) == 4
    assert attempt.answer == "4"
    assert attempt.metadata["votes"] == {"4": 3}
    assert "budget" in attempt.metadata["budget_exhausted"]


async def test_budget_with_nothing_to_show_reraises_and_run_records_it():
    backend = ScriptedBackend([(r".*", "\\boxed{1}")])
    c = ctx(backend, max_calls=1)
    await CoT().solve(task(), c)
    with pytest.raises(BudgetExhausted):
        await SSR(CoT()).solve(task(), c)  # not even a seed fits: nothing to return
    trace = await solve_one(SSR(CoT()), task(), backend, budget=Budget(max_calls=1))
    assert trace.error is None and trace.attempt.answer == "1"
    assert trace.attempt.metadata["stopped"] == "budget"


async def test_trace_is_a_provenance_dag_ending_in_select():
    backend = ScriptedBackend([(r"review committee", "Score: 7"),
                               (r"strict examiner", LOW.replace("2", "4")),
                               (r".*", "\\boxed{5}")])
    dei = DEI(CoT(), CritiqueRefine(CoT()), votes=2)
    [trace] = await run(dei, [task()], backend, concurrency=4)
    g = trace.graph()
    assert nx.is_directed_acyclic_graph(g)
    [final] = trace.attempt.events
    by_id = {e.id: e for e in trace.events}
    assert by_id[final].step == "select" and by_id[final].strategy == "dei"
    ancestors = {by_id[a].step for a in nx.ancestors(g, final)}
    assert {"draft", "critique", "review"} <= ancestors


def test_registry_aliases_and_python_construction():
    assert strategies.REGISTRY["self_consistency"] is strategies.REGISTRY["sc"]
    assert repr(strategies.build("self_consistency(n=3)")) == "sc(cot, n=3)"
    sc = SelfConsistency(n=4)  # default inner: the class's default_inner, with defaults
    assert isinstance(sc.inner[0], CoT) and sc.params.n == 4
    with pytest.raises(SpecError, match="n expects int"):
        SelfConsistency(CoT(), n="many")
    # the same messages as the graph gives for the same mistakes
    with pytest.raises(SpecError, match="sc takes 1 inner strategy, got 2"):
        SelfConsistency(CoT(), CoT())
    with pytest.raises(SpecError, match=r"sc has no parameter 'nn'; did you mean 'n'\?"):
        SelfConsistency(CoT(), nn=4)
    assert repr(DEI()) == "dei(ssr(cot), critique_refine(cot), sage(cot))"
    assert repr(DEI()) == repr(strategies.build("dei"))
    names = [d["name"] for d in strategies.describe()]
    assert names == ["cot", "sc", "asc", "best_of_n", "critique_refine", "ssr", "ssr_ada",
                     "ssr_plan", "sage", "dei", "moa", "genselect", "re2", "cot_reflection",
                     "deepconf", "force_thinking", "early_exit", "pot", "self_debug", "tir",
                     "beam", "dvts", "particle", "mcts", "memory", "cascade", "auto"]
    dei = next(d for d in strategies.describe() if d["name"] == "dei")
    assert dei["params"]["votes"]["default"] == 10 and dei["inner"] == "1..any"


async def test_a_spent_budget_carries_the_finished_attempts_as_a_type() -> None:
    done = Attempt(text="\\boxed{4}", answer="4")

    async def finished() -> Attempt:
        return done

    async def spent() -> Attempt:
        raise BudgetExhausted("call budget of 1 spent")

    with pytest.raises(PartialAttempts) as info:
        await gather_attempts([finished(), spent()])
    assert isinstance(info.value, BudgetExhausted) and info.value.attempts == [done]
    assert info.value.message == "call budget of 1 spent"
