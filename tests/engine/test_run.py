"""engine.run's final constraint: one more call shapes a strategy's answer, and the
answer's own sample (with its logprobs) is found in the trace."""

from __future__ import annotations

import asyncio
import json

import pytest

from refinery.engine.constraints import Constraint
from refinery.engine.context import Budget
from refinery.engine.errors import BudgetExhausted
from refinery.engine.run import (
    answer_completion,
    format_instruction,
    iter_run,
    reasoning_tokens,
    solve_choices,
    solve_one,
)
from refinery.engine.types import Delta, SamplingParams, Task
from refinery.strategies.cot import CoT
from refinery.strategies.self_consistency import SelfConsistency
from tests.scripted_backend import ScriptedBackend

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"]}
SOLUTION = "3 + 4 = 7, doubled 14. \\boxed{14}"


def reply(messages, params: SamplingParams, i: int) -> str:
    """JSON under a constraint (the double does not enforce it), a solution otherwise."""
    return '{"answer": 14}' if params.constraint is not None else SOLUTION


def task() -> Task:
    return Task.from_prompt("Tom has 3 apples and buys 4 more, then doubles them.")


async def test_final_constraint_adds_one_greedy_constrained_call_after_the_strategy():
    backend = ScriptedBackend([(r".*", reply)])
    constraint = Constraint.from_schema(SCHEMA, name="result")
    trace = await solve_one(SelfConsistency(CoT(), n=3), task(), backend,
                            params=SamplingParams(temperature=0.8, logprobs=True,
                                                  top_logprobs=2),
                            final_constraint=constraint)
    *steps, final = backend.calls
    # The strategy's own calls: unconstrained, no top logprobs (sc asks for logprobs itself).
    assert all(c.params.constraint is None and c.params.top_logprobs == 0 for c in steps)
    assert final.params.constraint == constraint and final.params.temperature == 0.0
    assert final.params.logprobs and final.params.top_logprobs == 2 and final.n == 1
    # The conversation, the strategy's solution, then the format instruction.
    assert [m.role for m in final.messages] == ["user", "assistant", "user"]
    assert final.messages[1].content == SOLUTION
    assert json.dumps(SCHEMA) in final.messages[2].content
    attempt = trace.attempt
    assert attempt.text == '{"answer": 14}' and attempt.answer == "14"
    assert attempt.metadata["reasoning"] == SOLUTION
    last = trace.events[-1]
    assert last.strategy == "format" and last.step == "final"
    assert attempt.events == [last.id] and last.parents  # linked to the strategy's work
    assert trace.usage.calls == len(backend.calls) == 2
    assert answer_completion(trace).token_logprobs[0].top_logprobs[1].token == "alt1"


async def test_the_strategy_does_not_stream_but_the_constrained_answer_does():
    backend = ScriptedBackend([(r".*", reply)])
    pieces: list[str] = []

    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)

    trace = await solve_one(CoT(), task(), backend, final_sink=sink,
                            final_constraint=Constraint.any_json())
    assert "".join(pieces) == trace.attempt.text == '{"answer": 14}'


async def test_the_final_call_is_budgeted_like_any_call():
    backend = ScriptedBackend([(r".*", reply)])
    with pytest.raises(BudgetExhausted):
        await solve_choices(CoT(), task(), backend, budget=Budget(max_calls=1),
                            final_constraint=Constraint.any_json(), on_exhausted="raise")
    assert len(backend.calls) == 1  # the strategy's call; the final one was refused


def test_format_instruction_names_the_shape():
    assert "exactly one of: yes, no" in format_instruction(Constraint.one_of(["yes", "no"]))
    assert "[0-9]+" in format_instruction(Constraint.from_regex("[0-9]+"))
    assert "JSON object" in format_instruction(Constraint.any_json())


async def test_answer_completion_is_the_sample_that_became_the_answer():
    backend = ScriptedBackend([(r".*", ["\\boxed{1}", "\\boxed{2}", "\\boxed{2}"])])
    trace = await solve_one(SelfConsistency(CoT(), n=3), task(), backend,
                            params=SamplingParams(logprobs=True))
    comp = answer_completion(trace)
    assert comp is not None and comp.text == trace.attempt.text == "\\boxed{2}"
    assert comp.token_logprobs is not None
    trace.attempt = trace.attempt.model_copy(update={"text": "edited"})
    assert answer_completion(trace) is None


# -- reasoning tokens -----------------------------------------------------------------------

SAMPLES = ["two and two make \\boxed{4}", "\\boxed{5}", "it is \\boxed{4}"]  # 5, 1, 3 words


async def test_reasoning_tokens_are_all_but_the_returned_sample():
    backend = ScriptedBackend([(r".*", SAMPLES)])
    [trace] = await solve_choices(SelfConsistency(CoT(), n=3), task(), backend)
    # The double counts a word as a token: 5 + 1 + 3 generated; the first 4-vote returned.
    assert trace.attempt.text == SAMPLES[0]
    assert trace.usage.completion_tokens == 9
    assert reasoning_tokens([trace], trace.usage) == 9 - 5


async def test_reasoning_tokens_sum_the_answers_of_every_choice():
    backend = ScriptedBackend([(r".*", SAMPLES)])
    traces = await solve_choices(SelfConsistency(CoT(), n=3), task(), backend, n=2)
    assert traces[0].usage.completion_tokens == 18  # shared by the two choices
    assert reasoning_tokens(traces, traces[0].usage) == 18 - 5 - 5


async def test_a_plain_generation_has_no_reasoning_tokens():
    backend = ScriptedBackend([(r".*", SAMPLES)])
    traces = await solve_choices(CoT(), task(), backend, n=2)
    assert reasoning_tokens(traces, traces[0].usage) == 0


async def test_with_a_format_call_every_strategy_token_is_reasoning():
    backend = ScriptedBackend([(r".*", reply)])
    trace = await solve_one(SelfConsistency(CoT(), n=3), task(), backend,
                            final_constraint=Constraint.from_schema(SCHEMA, name="result"))
    strategy_tokens = 3 * len(SOLUTION.split())
    answer_tokens = len('{"answer": 14}'.split())
    assert trace.usage.completion_tokens == strategy_tokens + answer_tokens
    assert reasoning_tokens([trace], trace.usage) == strategy_tokens


async def test_an_edited_answer_makes_every_token_reasoning():
    backend = ScriptedBackend([(r".*", SAMPLES)])
    [trace] = await solve_choices(SelfConsistency(CoT(), n=3), task(), backend)
    trace.attempt = trace.attempt.model_copy(update={"text": "composed from the samples"})
    assert reasoning_tokens([trace], trace.usage) == 9


async def test_a_set_stop_lets_the_tasks_in_flight_finish_and_starts_no_other():
    stop = asyncio.Event()

    def reply(messages, params, i) -> str:
        stop.set()  # at the first call, while three tasks are in flight
        return SOLUTION

    backend = ScriptedBackend([(r".*", reply)], delay=0.01)
    tasks = [Task.from_prompt(f"Question {i}?", id=f"t{i}") for i in range(8)]
    got = [t async for t in iter_run(CoT(), tasks, backend, concurrency=3, stop=stop)]
    assert sorted(t.task_id for t in got) == ["t0", "t1", "t2"] and len(backend.calls) == 3
    assert all(t.error is None and t.attempt.answer == "14" for t in got)
