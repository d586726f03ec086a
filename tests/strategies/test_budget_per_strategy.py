"""Budgets hold for every strategy, whatever its spec.

Every registered strategy, and a composite committee, is solved under call,
token and time budgets by a scripted engine whose calls overlap (``yields``:
concurrent calls interleave as in vLLM's batching). The property:

* calls: spent calls <= ``max_calls``;
* tokens: spent tokens <= ``max_tokens`` + one call's worth, where one call's
  worth is the largest prompt (in tokens) of any single call the task made;
  that is the most the estimation error of one call's prompt can be. The
  scripted engine's prompt count is exact, so here the budget holds exactly,
  which is asserted too;
* seconds: no timed assert. The engine hangs on calls after the first ``k``;
  the deadline must cancel every call in flight, and no call may start after
  the first cancellation (the deadline);
* every case ends with an answer or a clean "budget exhausted" error, never
  an exception.
"""

from __future__ import annotations

import json

import pytest

from refinery import strategies
from refinery.engine.context import Budget
from refinery.engine.run import solve_one
from refinery.engine.trace import Trace
from refinery.engine.types import Message, SamplingParams
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import task

SPECS = ["cot", "sc", "best_of_n", "critique_refine", "ssr", "ssr_ada", "ssr_plan", "sage",
         "dei", "dei(ssr, critique_refine, sage(cot))", "moa", "re2", "cot_reflection",
         "moa(cot_reflection)", "deepconf", "deepconf(mode='offline')"]
PAD = " and so on" * 30  # replies longer than the caps, so token budgets bite


def decomposition(messages, params, i):
    steps = [{"description": "How many apples after buying?", "answer": "7"},
             {"description": "How many after doubling?", "answer": "14"}]
    return "```json\n" + json.dumps({"sub-questions": steps}) + "\n```"


RULES = [
    (r"Re-evaluate your solution",
     "<evaluation>I mis-added.</evaluation>\n3 + 4 = 7, doubled 14. <answer>14</answer>" + PAD),
    (r"Feedback on your solution", "Rewritten: 7, doubled 14. <answer>14</answer>" + PAD),
    (r"rate the solution from 0", "Mostly fine. Score: 3"),
    (r"atomic sub-questions", decomposition),
    (r"Answer only this sub-question", ["<answer>7", "<answer>8", "so <answer>14"]),
    (r"strict examiner", "Correctness: 2\nCompleteness: 2\nReasoning validity: 2\nFormat: 2"),
    (r"review committee", ["Fine. Score: 7", "Weak. Score: 4" + PAD]),
    (r"grading a solution", "Score: 6"),
    (r"Critique the plan", "Sound. Score: 3"),
    (r"Summarise the plan", "1. add the apples 2. double the pile" + PAD),
    (r"Do not solve the problem", "Goal: count apples.\nKey steps: add, then double." + PAD),
    (r"three tagged parts", "<thinking>3 + 4 = 7, doubled 14." + PAD
     + "</thinking><reflection>Fine.</reflection><output>\\boxed{14}</output>"),
    (r".*", ["3 + 4 = 7, doubled 14. \\boxed{14}" + PAD, "7 then 16. \\boxed{16}" + PAD]),
]

PARAMS = SamplingParams(temperature=0.7, max_tokens=64)
CALLS = [1, 2, 3, 5]
TOKENS = [50, 200, 1000]


def engine(**knobs) -> ScriptedBackend:
    return ScriptedBackend(RULES, yields=knobs.pop("yields", 7), **knobs)


def one_calls_worth(backend: ScriptedBackend) -> int:
    """The largest prompt of a single call: the slack the token budget may take."""
    return max((backend.count_tokens(c.messages) for c in backend.calls), default=0)


def check_clean(trace: Trace) -> None:
    assert (trace.attempt is not None) != (trace.error is not None)
    if trace.error is not None:
        assert trace.error.startswith("budget exhausted before any answer")


async def solve(spec: str, backend: ScriptedBackend, budget: Budget) -> Trace:
    strategy = strategies.build(spec)
    trace = await solve_one(strategy, task(), backend, budget=budget, params=PARAMS, spec=spec)
    check_clean(trace)
    # every call the engine saw is accounted, and nothing is left reserved
    assert trace.usage.calls == len(backend.calls)
    return trace


@pytest.mark.parametrize("spec", SPECS)
async def test_call_budget_holds(spec):
    figures = []
    for max_calls in CALLS:
        backend = engine()
        trace = await solve(spec, backend, Budget(max_calls=max_calls))
        assert trace.usage.calls <= max_calls, (spec, max_calls)
        figures.append(f"max_calls={max_calls}: calls={trace.usage.calls}")
    free = await solve(spec, engine(), Budget())
    print(f"{spec} (unbudgeted: calls={free.usage.calls}): " + ", ".join(figures))


@pytest.mark.parametrize("spec", SPECS)
async def test_token_budget_holds(spec):
    figures = []
    for max_tokens in TOKENS:
        backend = engine()
        trace = await solve(spec, backend, Budget(max_tokens=max_tokens))
        slack = one_calls_worth(backend)
        assert trace.usage.total_tokens <= max_tokens + slack, (spec, max_tokens)
        # the scripted prompt count is exact: no estimation error, no overshoot at all
        assert trace.usage.total_tokens <= max_tokens, (spec, max_tokens)
        figures.append(f"max_tokens={max_tokens}: tokens={trace.usage.total_tokens} "
                       f"calls={trace.usage.calls} (slack {slack})")
    print(f"{spec}: " + "; ".join(figures))


@pytest.mark.parametrize("spec", SPECS)
async def test_mixed_budget_holds_with_underestimated_prompts(spec):
    """With a prompt count that is off by half, the overshoot stays within the slack."""

    class Rough(ScriptedBackend):
        def count_tokens(self, messages):
            return super().count_tokens(messages) // 2

    for max_calls, max_tokens in [(3, 200), (5, 1000)]:
        backend = Rough(RULES, yields=7)
        trace = await solve(spec, backend, Budget(max_calls=max_calls, max_tokens=max_tokens))
        true_prompt = max((ScriptedBackend.count_tokens(backend, c.messages)
                           for c in backend.calls), default=0)
        assert trace.usage.calls <= max_calls
        assert trace.usage.total_tokens <= max_tokens + true_prompt, (spec, max_tokens)


@pytest.mark.parametrize("answered", [0, 1, 3])
@pytest.mark.parametrize("spec", SPECS)
async def test_deadline_cancels_in_flight_calls(spec, answered):
    # the first `answered` calls finish; every later call hangs until cancelled
    backend = engine(hang_after=answered)
    trace = await solve(spec, backend, Budget(max_seconds=0.3))
    started = [i for what, i in backend.log if what == "start"]
    cancelled = backend.cancelled
    hung = [i for i in started if i >= answered]
    # a hung call ends only by cancellation: the deadline cancelled every one of them
    assert sorted(cancelled) == hung
    if not hung:  # the strategy needed no more than the answered calls: no deadline
        assert trace.attempt is not None and len(started) <= answered
        return
    # no call started after the deadline's first cancellation
    first_cancel = backend.log.index(("cancel", cancelled[0]))
    assert all(what != "start" for what, _ in backend.log[first_cancel:])
    if trace.attempt is not None:
        # an answer despite the deadline: the best so far, marked as cut by the budget
        assert "time budget" in trace.attempt.metadata.get("budget_exhausted", "")
    else:
        assert "time budget" in trace.error
    print(f"{spec} answered={answered}: started={len(started)} cancelled={len(cancelled)} "
          f"answer={trace.attempt.answer if trace.attempt else None!r}")


async def test_concurrent_members_are_refused_once_reserved():
    """A committee admits its members one by one, never all at once past its budget."""
    backend = engine()
    await solve("dei(cot, cot, cot, cot, cot)", backend, Budget(max_calls=2))
    assert len(backend.calls) == 2


def test_slack_is_one_prompt():
    backend = engine()
    backend.calls.append(type("C", (), {"messages": [Message(role="user", content="a b c")]}))
    assert one_calls_worth(backend) == 7
