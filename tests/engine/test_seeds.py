"""Per-call seeds: every call of a seeded run gets its own, reproducible seed."""

from __future__ import annotations

from refinery.engine.context import Budget, Context, derive_seed
from refinery.engine.types import Message, SamplingParams, Task
from refinery.strategies.best_of_n import BestOfN
from refinery.strategies.cot import CoT
from refinery.strategies.self_consistency import SelfConsistency
from tests.scripted_backend import ScriptedBackend

Q = [Message(role="user", content="What is 2+2?")]


def seeded_backend() -> ScriptedBackend:
    """A double that honours seeds: the answer is a function of the call's seed."""
    def by_seed(messages, params, i):
        return f"Working. The answer is \\boxed{{{(params.seed or 0) % 1000 + i}}}."

    return ScriptedBackend([(r"Score: N", "Looks right. Score: 7"), (r".*", by_seed)])


def context(backend, seed: int | None) -> Context:
    return Context(backend, task=Task.from_prompt("What is 2+2?"), budget=Budget(),
                   params=SamplingParams(seed=seed, max_tokens=64))


async def test_identical_calls_get_distinct_seeds_and_unseeded_stay_unseeded():
    backend = seeded_backend()
    ctx = context(backend, 1234)
    for _ in range(3):
        await ctx.generate(Q, step="draft", strategy="cot")
    await ctx.inner().generate(Q, step="draft", strategy="cot")  # views share the count
    seeds = [c.params.seed for c in backend.calls]
    assert len(set(seeds)) == 4 and 1234 not in seeds
    assert all(0 <= s < 2**63 for s in seeds)
    plain = seeded_backend()
    await context(plain, None).generate(Q, step="draft", strategy="cot")
    assert plain.calls[0].params.seed is None


def test_the_seed_depends_on_the_place_not_on_time():
    assert derive_seed(1, "p", 0) == derive_seed(1, "p", 0)
    assert len({derive_seed(1, "p", 0), derive_seed(1, "p", 1), derive_seed(1, "q", 0),
                derive_seed(2, "p", 0)}) == 4


async def run_bon(seed: int) -> tuple[list[str], list[tuple[str, int]], str]:
    backend = seeded_backend()
    strategy = BestOfN(SelfConsistency(CoT(), n=1), n=3, scorer="judge")
    ctx = context(backend, seed)
    attempt = await strategy.solve(ctx.task, ctx)
    candidates = [backend._reply(c.messages, c.params, 0) for c in backend.calls
                  if "Score: N" not in c.messages[-1].content]
    calls = [(c.messages[-1].content[:30], c.params.seed) for c in backend.calls]
    return candidates, calls, attempt.text


async def test_best_of_n_over_a_non_cot_inner_gets_different_candidates():
    backend = seeded_backend()
    strategy = BestOfN(SelfConsistency(CoT(), n=1), n=3, scorer="judge")
    ctx = context(backend, 1234)
    await strategy.solve(ctx.task, ctx)
    sampled = [c for c in backend.calls if "Score: N" not in c.messages[-1].content]
    assert len(sampled) == 3
    # identical prompts, but three seeds, so three different candidates
    assert len({c.params.seed for c in sampled}) == 3
    answers = {backend._reply(c.messages, c.params, 0) for c in sampled}
    assert len(answers) == 3


async def test_the_same_seeded_request_twice_gives_the_same_run():
    first, second, other = await run_bon(1234), await run_bon(1234), await run_bon(99)
    assert first == second
    assert first[1] != other[1]  # another seed, other calls
