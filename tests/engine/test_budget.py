"""Budget reservations: concurrent calls of one task cannot overshoot the budget.

The scripted double yields inside every call (``yields``), so calls started
with ``asyncio.gather`` are all in flight at once, as with vLLM's batching;
admission must then count what is reserved, not only what is spent.
"""

from __future__ import annotations

import asyncio

import pytest

from refinery.engine.context import LOOP_NUDGE, Budget, Context
from refinery.engine.errors import BackendError, BudgetExhausted
from refinery.engine.types import Completion, Delta, Message, SamplingParams, Usage
from tests.scripted_backend import ScriptedBackend

Q = [Message(role="user", content="q")]
PROMPT = 5  # ScriptedBackend.count_tokens(Q): one word + 4 per message


def backend(reply: str = "one two three", **knobs) -> ScriptedBackend:
    return ScriptedBackend([(".*", reply)], yields=knobs.pop("yields", 5), **knobs)


async def gather(ctx: Context, k: int, **kwargs) -> list:
    return await asyncio.gather(*(ctx.generate(Q, **kwargs) for _ in range(k)),
                                return_exceptions=True)


async def test_concurrent_calls_beyond_the_call_budget_are_refused():
    b = backend()
    ctx = Context(b, budget=Budget(max_calls=3))
    results = await gather(ctx, 8)
    refused = [r for r in results if isinstance(r, BudgetExhausted)]
    assert len(refused) == 5 and all("call budget of 3" in str(r) for r in refused)
    # the refused ones never reached the backend; the admitted three really overlapped
    assert len(b.calls) == 3 and ctx.spent.calls == 3
    assert [w for w, _ in b.log[:3]] == ["start"] * 3
    assert ctx.reserved == Usage()


async def test_reservation_counts_prompt_and_every_sample():
    b = backend(reply="w " * 100)
    ctx = Context(b, budget=Budget(max_tokens=100), params=SamplingParams(max_tokens=40))
    first = asyncio.ensure_future(ctx.generate(Q, n=2))
    await asyncio.sleep(0)  # admitted and in flight, not yet accounted
    assert ctx.spent == Usage()
    assert ctx.reserved == Usage(prompt_tokens=PROMPT, completion_tokens=80, calls=1)
    # 100 - 85 reserved = 15 left: a second call gets 15 - 5 (its prompt) = 10 tokens
    second = asyncio.ensure_future(ctx.generate(Q))
    await asyncio.sleep(0)
    assert b.calls[1].params.max_tokens == 10
    # nothing is left for a third: refused before it reaches the backend
    with pytest.raises(BudgetExhausted, match="token budget of 100"):
        await ctx.generate(Q)
    await asyncio.gather(first, second)
    assert len(b.calls) == 2 and ctx.reserved == Usage()
    assert ctx.spent == Usage(prompt_tokens=2 * PROMPT, completion_tokens=80 + 10, calls=2)
    assert ctx.spent.total_tokens == 100


async def test_token_budget_holds_for_many_concurrent_calls():
    b = backend(reply="w " * 100)
    ctx = Context(b, budget=Budget(max_tokens=200), params=SamplingParams(max_tokens=64))
    results = await gather(ctx, 10)
    done = [r for r in results if not isinstance(r, BaseException)]
    assert len(done) == len(b.calls) == 3  # 69 + 69 + (62 - 5 = 57 tokens) = 200
    assert ctx.spent.total_tokens == 200


async def test_inner_contexts_reserve_under_the_root():
    b = backend()
    ctx = Context(b, budget=Budget(max_calls=2))
    results = await asyncio.gather(ctx.inner().generate(Q), ctx.fork().generate(Q),
                                   ctx.inner().inner().generate(Q), return_exceptions=True)
    assert sum(isinstance(r, BudgetExhausted) for r in results) == 1
    assert ctx.spent.calls == 2 and len(b.calls) == 2


class FailingBackend(ScriptedBackend):
    async def generate(self, messages, params, *, n=None, stop_rule=None):
        await super().generate(messages, params, n=n, stop_rule=stop_rule)
        raise BackendError("upstream fell over")


async def test_reservation_released_on_error():
    b = FailingBackend([(".*", "x")], yields=3)
    ctx = Context(b, budget=Budget(max_calls=2, max_tokens=1000))
    with pytest.raises(BackendError):
        await ctx.generate(Q)
    # the failed call was made, so it counts as a call; its tokens are unknown
    assert ctx.reserved == Usage() and ctx.spent == Usage(calls=1)
    with pytest.raises(BackendError):
        await ctx.generate(Q)  # the second call is still admitted
    with pytest.raises(BudgetExhausted, match="call budget of 2"):
        await ctx.generate(Q)


async def test_reservation_released_on_cancellation():
    b = backend(hang_after=0)
    ctx = Context(b, budget=Budget(max_calls=2, max_tokens=1000))
    call = asyncio.ensure_future(ctx.generate(Q))
    await asyncio.sleep(0)  # the call runs up to its hang
    assert b.log == [("start", 0)] and ctx.reserved.calls == 1
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert b.cancelled == [0]
    assert ctx.reserved == Usage() and ctx.spent == Usage(calls=1)


async def test_deadline_cancels_calls_in_flight_and_admits_none_after():
    b = backend(hang_after=0)
    ctx = Context(b, budget=Budget(max_seconds=0.2))
    results = await gather(ctx, 3)
    assert all(isinstance(r, BudgetExhausted) and "time budget" in str(r) for r in results)
    assert sorted(b.cancelled) == [0, 1, 2]
    with pytest.raises(BudgetExhausted, match="time budget"):
        await ctx.generate(Q)
    assert len(b.calls) == 3 and ctx.reserved == Usage()


async def test_deadline_aborts_a_streamed_final_answer():
    b = backend(reply="w " * 50, hang_after=0)
    pieces: list[str] = []

    async def sink(delta: Delta) -> None:
        pieces.append(delta.text)

    ctx = Context(b, budget=Budget(max_seconds=0.2), final_sink=sink)
    with pytest.raises(BudgetExhausted, match="time budget"):
        await ctx.generate(Q, final=True)
    assert b.cancelled == [0] and pieces == [] and ctx.reserved == Usage()


async def test_stream_closed_when_the_consumer_is_cancelled():
    b = backend(reply="w " * 50)
    started = asyncio.Event()

    async def sink(delta: Delta) -> None:
        started.set()
        await asyncio.Event().wait()  # a client that stops reading

    ctx = Context(b, final_sink=sink)
    call = asyncio.ensure_future(ctx.generate(Q, final=True))
    await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # the backend's stream was closed at once (an abort), not left to the GC
    assert b.cancelled == [0] and ctx.reserved == Usage()


class LoopOnceBackend(ScriptedBackend):
    """Marks every un-nudged sample as a loop that used its whole cap."""

    async def generate(self, messages, params, *, n=None, stop_rule=None):
        comps = await super().generate(messages, params, n=n, stop_rule=stop_rule)
        if messages[-1].content == LOOP_NUDGE:
            return comps
        return [Completion(text="loop", prompt_tokens=c.prompt_tokens,
                           completion_tokens=params.max_tokens, finish_reason="loop")
                for c in comps]


class Always:
    top_logprobs = 0
    stops_whole_as_streamed = False

    def start(self):
        class M:
            def feed(self, text, tokens):
                return None

            def measures(self):
                return None
        return M()


@pytest.mark.parametrize("max_calls,retried", [(2, 1), (4, 3), (10, 3)])
async def test_loop_retries_reserve_too(max_calls, retried):
    b = LoopOnceBackend([(".*", "fresh")], yields=3)
    ctx = Context(b, budget=Budget(max_calls=max_calls), loop_detector=Always())
    gen = await ctx.generate(Q, n=3)
    # the concurrent retries are admitted only while the budget has room
    assert [c.text for c in gen].count("fresh") == retried
    assert ctx.spent.calls == 1 + retried <= max_calls and len(b.calls) == 1 + retried
    assert ctx.trace.events[-1].usage.calls == retried


async def test_loop_retries_within_the_token_budget():
    b = LoopOnceBackend([(".*", "w " * 100)], yields=3)
    ctx = Context(b, budget=Budget(max_tokens=300), params=SamplingParams(max_tokens=50),
                  loop_detector=Always())
    await ctx.generate(Q, n=3)
    assert ctx.spent.total_tokens <= 300
    assert ctx.reserved == Usage()
