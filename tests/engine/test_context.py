"""Context: budgets, usage accounting, loop retries and final streaming."""

from __future__ import annotations

import pytest

from refinery.engine.constraints import Constraint
from refinery.engine.context import LOOP_NUDGE, Budget, Context
from refinery.engine.errors import BudgetExhausted
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.stops import Stop
from refinery.engine.types import Completion, Delta, Message, SamplingParams
from tests.scripted_backend import ScriptedBackend

Q = [Message(role="user", content="q")]


async def test_call_budget_refuses_the_next_call():
    ctx = Context(ScriptedBackend([(".*", "one two three")]), budget=Budget(max_calls=2))
    await ctx.generate(Q)
    await ctx.generate(Q, n=3)
    assert ctx.spent.calls == 2
    with pytest.raises(BudgetExhausted, match="call budget of 2"):
        await ctx.generate(Q)


async def test_token_budget_shrinks_max_tokens_then_refuses():
    backend = ScriptedBackend([(".*", "w " * 100)])
    ctx = Context(backend, budget=Budget(max_tokens=60),
                  params=SamplingParams(max_tokens=100))
    [c] = await ctx.generate(Q)
    # clamped to what was left once the prompt (counted by the backend) is paid for
    assert backend.calls[0].params.max_tokens == 60 - backend.count_tokens(Q)
    assert c.finish_reason == "length"
    with pytest.raises(BudgetExhausted, match="token budget"):
        await ctx.generate(Q)
    # The backend's prompt count is exact here, so there is no overshoot at all.
    assert ctx.spent.total_tokens == 60


async def test_inner_and_fork_share_usage():
    ctx = Context(ScriptedBackend([(".*", "a b")]))
    await ctx.inner().generate(Q)
    await ctx.fork(final_sink=None).generate(Q, n=2)
    assert ctx.spent.calls == 2
    assert ctx.spent.completion_tokens == 2 + 4


class LoopingBackend(ScriptedBackend):
    """Marks the first sample of the un-nudged prompt as a loop."""

    async def generate(self, messages, params, *, n=None, stop_rule=None):
        comps = await super().generate(messages, params, n=n, stop_rule=stop_rule)
        if messages[-1].content != LOOP_NUDGE and stop_rule is not None:
            c = comps[0]
            comps[0] = Completion(text="loop loop", prompt_tokens=c.prompt_tokens,
                                  completion_tokens=50, finish_reason="loop", loop_onset=9)
        return comps


class AlwaysDetector:
    """A stop rule that calls every sample a loop from its first piece on."""

    top_logprobs = 0
    stops_whole_as_streamed = False

    def start(self):
        class M:
            def feed(self, text, tokens):
                return Stop("loop", keep=0)

            def measures(self):
                return None
        return M()


@pytest.mark.parametrize("policy,expect", [("retry", "fresh"), ("truncate", "loop loop")])
async def test_loop_policy(policy, expect):
    backend = LoopingBackend([(".*", "fresh")])
    ctx = Context(backend, loop_detector=AlwaysDetector(), loop_policy=policy)
    gen = await ctx.generate(Q, n=2)
    assert gen[0].text == expect and gen[1].text == "fresh"
    if policy == "retry":
        retry_call = backend.calls[-1]
        assert [m.role for m in retry_call.messages] == ["user", "assistant", "user"]
        assert retry_call.messages[1].content == "loop loop"
        assert ctx.spent.calls == 2
        assert [e.step for e in ctx.trace.events] == ["draft", "loop_retry"]
    else:
        assert ctx.spent.calls == 1


async def test_loop_policy_off_passes_no_monitor():
    backend = LoopingBackend([(".*", "fresh")])
    ctx = Context(backend, loop_detector=AlwaysDetector(), loop_policy="off")
    [c] = await ctx.generate(Q)
    assert c.finish_reason == "stop"


async def test_final_generation_streams_to_the_sink():
    pieces = []

    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)

    ctx = Context(ScriptedBackend([(".*", "the answer is 4")]), final_sink=sink)
    [c] = await ctx.generate(Q, final=True)
    assert "".join(pieces) == c.text == "the answer is 4" and len(pieces) == 4
    assert ctx.trace.events[0].data == {"final": True}
    await ctx.inner().generate(Q, final=True)  # inner contexts never stream
    assert len(pieces) == 4


async def test_constrained_calls_are_not_loop_monitored():
    seen = []

    class Recording(ScriptedBackend):
        async def generate(self, messages, params, *, n=None, stop_rule=None):
            seen.append(stop_rule)
            return await super().generate(messages, params, n=n, stop_rule=stop_rule)

    detector = CusumLoopDetector()
    ctx = Context(Recording([(r".*", '{"a": 1}')]), loop_detector=detector)
    msgs = [Message(role="user", content="x")]
    await ctx.generate(msgs, SamplingParams(max_tokens=8))
    await ctx.generate(msgs, SamplingParams(max_tokens=8,
                                            constraint=Constraint.any_json()))
    # structure repeats by design; the constraint's bounds cap the length instead
    assert seen == [detector, None]


async def test_cached_prompt_tokens_are_summed_and_a_shared_prompt_counts_once():
    ctx = Context(ScriptedBackend([(".*", "one two")], cached_tokens=3))
    await ctx.generate(Q, n=4)  # four samples of one prompt: its cache hit counts once
    assert ctx.spent.cached_tokens == 3
    await ctx.generate(Q)
    assert ctx.spent.cached_tokens == 6
    assert ctx.spent.prompt_tokens == 2 * 5 and ctx.spent.completion_tokens == 4 * 2 + 2


async def test_cached_tokens_stay_unknown_when_the_backend_does_not_say():
    ctx = Context(ScriptedBackend([(".*", "one two")]))
    await ctx.generate(Q, n=2)
    await ctx.generate(Q)
    assert ctx.spent.cached_tokens is None
