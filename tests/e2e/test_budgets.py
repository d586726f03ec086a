"""Budgets hold with the real engine: every strategy under a tight budget on one
GSM8K problem, and a deadline that really aborts the vLLM request.

One call's worth (the slack the issue allows) is the largest prompt of a
single call of the task; vLLM's prompt count is its own tokenizer's, so the
token budget is expected to hold exactly, and the slack is asserted as the
contract.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from refinery import strategies
from refinery.engine.context import Budget
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.run import solve_one
from refinery.engine.trace import Trace
from refinery.engine.types import SamplingParams, Task
from tests.conftest import GSM8K

pytestmark = pytest.mark.e2e

SPECS = ["cot", "sc", "best_of_n", "critique_refine", "ssr", "ssr_ada", "ssr_plan", "sage",
         "dei", "dei(ssr, critique_refine, sage(cot))"]
BUDGET = Budget(max_calls=3, max_tokens=400)
PARAMS = SamplingParams(temperature=0.7, max_tokens=64)


def gsm8k(row: int) -> Task:
    with open(GSM8K / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return Task.from_prompt(rows[row]["question"], id=f"gsm8k-{row}")


def one_calls_worth(trace: Trace) -> int:
    """The largest prompt of one call of the task (tokens)."""
    return max((e.usage.prompt_tokens for e in trace.events
                if e.kind == "generation" and e.usage is not None), default=0)


def clean(trace: Trace) -> bool:
    """An answer, or the clean error of a budget with nothing to show."""
    if trace.attempt is not None:
        return trace.error is None
    return (trace.error or "").startswith("budget exhausted before any answer")


async def test_every_strategy_stays_within_a_tight_budget(vllm_backend):
    task = gsm8k(0)

    async def one(spec: str) -> Trace:
        # solve_one raises anything but a spent budget: an exception fails the test
        return await solve_one(strategies.build(spec), task, vllm_backend, budget=BUDGET,
                               params=PARAMS, loop_detector=CusumLoopDetector(), spec=spec)

    traces = await asyncio.gather(*(one(s) for s in SPECS))
    report = []
    for spec, trace in zip(SPECS, traces, strict=True):
        used, slack = trace.usage, one_calls_worth(trace)
        report.append(f"{spec}: calls={used.calls} tokens={used.total_tokens} "
                      f"(prompt {used.prompt_tokens} + completion {used.completion_tokens}, "
                      f"slack {slack}) answer={trace.attempt.answer if trace.attempt else None!r}"
                      f" error={trace.error!r}")
    print("\n".join(report))
    for spec, trace in zip(SPECS, traces, strict=True):
        assert clean(trace), (spec, trace.error)
        assert 1 <= trace.usage.calls <= BUDGET.max_calls, spec
        assert trace.usage.total_tokens <= BUDGET.max_tokens + one_calls_worth(trace), spec
        # vLLM's own tokenizer counts the prompts, so there is no estimation error
        assert trace.usage.total_tokens <= BUDGET.max_tokens, spec
        # every call is in the trace: the usage is not under-reported
        gens = [e for e in trace.events if e.kind == "generation"]
        assert sum(e.usage.calls for e in gens) == trace.usage.calls, spec
    assert vllm_backend.num_unfinished_requests() == 0


@pytest.mark.parametrize("streamed", [False, True])
async def test_deadline_aborts_the_vllm_request(vllm_backend, streamed):
    # Test problem 328 loops greedily until max_tokens (tests/e2e/test_loop_stop.py):
    # 2048 tokens take far longer than the 1 s budget, so the deadline must cut it.
    pieces: list[str] = []

    async def sink(text: str) -> None:
        pieces.append(text)

    trace = await solve_one(strategies.build("cot"), gsm8k(328), vllm_backend,
                            budget=Budget(max_seconds=1.0),
                            params=SamplingParams(temperature=0.0, max_tokens=2048),
                            loop_policy="off", final_sink=sink if streamed else None)
    assert trace.attempt is None and "time budget of 1.0s spent" in trace.error
    # the cancelled call counts as a call, and its reservation is gone
    assert trace.usage.calls == 1
    # the request was aborted inside vLLM, not left generating to max_tokens
    assert vllm_backend.num_unfinished_requests() == 0
