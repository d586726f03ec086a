"""tir's control flow on a scripted backend, its code run in the real sandbox."""

from __future__ import annotations

import pytest

from refinery.engine.backends.base import ContinuationUnsupportedError
from refinery.strategies import build
from refinery.strategies.tir import (
    OUTPUT_FENCE,
    ToolIntegratedReasoning,
    block_to_run,
    segment_constraint,
)
from tests.scripted_backend import ScriptedBackend
from tests.strategies._util import StrictBackend, ctx, task

BLOCK = "Tom has 3 + 4 apples, then twice that.\n```python\nprint((3 + 4) * 2)\n```"
ANSWER = "So he has 14 apples. The answer is \\boxed{14}."


def reply_by_runs(*replies: str):
    """A reply per point of the turn: the first before any output, then one per
    output block the partial assistant turn already holds."""
    def reply(messages, params, i):
        last = messages[-1]
        seen = last.content.count(OUTPUT_FENCE) if last.role == "assistant" else 0
        return replies[min(seen, len(replies) - 1)]
    return reply


async def test_a_block_runs_its_output_goes_in_and_the_turn_continues():
    backend = StrictBackend([(r".*", reply_by_runs(BLOCK, ANSWER))])  # replies fit the regex
    c = ctx(backend)
    attempt = await ToolIntegratedReasoning().solve(task(), c)
    assert attempt.answer == "14" and attempt.metadata == {"runs": 1, "failed_runs": 0}
    first, second = backend.calls
    assert (first.continue_final, second.continue_final) == (False, True)
    partial = second.messages[-1]
    assert partial.role == "assistant" and partial.content == f"{BLOCK}\n{OUTPUT_FENCE}\n14\n```\n"
    assert attempt.text == partial.content + ANSWER
    [run] = [e for e in c.trace.events if e.step == "execute"]
    assert run.data["ok"] is True and "print((3 + 4) * 2)" in run.text and "14" in run.text
    assert [e.step for e in c.trace.events if e.kind == "generation"] == ["draft", "continue"]


async def test_an_error_is_shown_to_the_model_as_the_output():
    backend = ScriptedBackend([(r".*", reply_by_runs(
        "```python\nprint(undefined_name)\n```", "```python\nprint(14)\n```", ANSWER))])
    attempt = await ToolIntegratedReasoning(structured=False).solve(task(), ctx(backend))
    assert attempt.metadata == {"runs": 2, "failed_runs": 1} and attempt.answer == "14"
    after_error = backend.calls[1].messages[-1].content
    assert "Error:" in after_error and "NameError" in after_error


async def test_max_calls_bounds_the_runs_and_the_last_segment_must_answer():
    backend = ScriptedBackend([(r".*", BLOCK)])
    attempt = await ToolIntegratedReasoning(max_calls=2, structured=False).solve(
        task(), ctx(backend))
    assert len(backend.calls) == 3 and attempt.metadata["runs"] == 2
    assert [OUTPUT_FENCE in c.params.stop for c in backend.calls] == [True, True, False]
    answer_only = segment_constraint(may_run=False)
    assert answer_only.accepts(ANSWER) and not answer_only.accepts(BLOCK)
    assert segment_constraint(may_run=True).accepts(BLOCK)


async def test_a_backend_that_cannot_continue_is_refused_before_any_call():
    backend = ScriptedBackend([(r".*", BLOCK)], continues_messages=False)
    with pytest.raises(ContinuationUnsupportedError):
        await ToolIntegratedReasoning().solve(task(), ctx(backend))
    assert backend.calls == []


async def test_a_spent_budget_keeps_what_was_written():
    backend = ScriptedBackend([(r".*", reply_by_runs(BLOCK, ANSWER))])
    attempt = await ToolIntegratedReasoning(structured=False).solve(
        task(), ctx(backend, max_calls=1))
    assert len(backend.calls) == 1 and attempt.metadata["runs"] == 1
    assert attempt.text.endswith(f"{OUTPUT_FENCE}\n14\n```\n")
    assert attempt.answer == "14"  # read from the text as cot's are: its last number


def test_only_a_block_that_ends_the_text_is_run():
    two = "```python\nx = 1\n```\n```output\n\n```\nthen\n```python\nprint(2)\n```\n"
    assert block_to_run(two) == "print(2)\n"
    assert block_to_run(BLOCK + " and so on") is None
    assert block_to_run("no code") is None


def test_spec_and_optillm_name_reach_it():
    from refinery.serving.optillm import spec_of

    assert isinstance(build("tir(max_calls=2)"), ToolIntegratedReasoning)
    assert spec_of("executecode") == "tir"
