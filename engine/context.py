"""Context: everything a strategy may touch while solving one task.

A strategy calls the model only through ``ctx.generate``, so every call is
budgeted, watched by its stop rules (the loop detector, and a strategy's own
rule such as DeepConf's confidence: ``generate(..., stop_rule=...)`` or a
``fork(stop_rule=...)`` view; engine/stops.py) and traced with its parents
(making the task's trace a provenance DAG). ``ctx.emit`` records a strategy step and
forwards it to a live listener (the server streams it as reasoning).

One Context per task; strategies running concurrently on the same task share
it, which is what makes the budget a per-task budget.

Budget admission reserves: a call admitted while others are still in flight
must fit next to their worst cases, not only next to what is already spent,
or concurrent calls (sc samples, ssr's batched re-solves, dei's members and
reviews) would all be admitted before any of them is accounted. A call
reserves one call and its prompt (counted by the backend) plus ``n x
max_tokens`` under the root context; when it ends, however it ends, the
reservation is replaced by its real usage. Calls therefore never exceed
``max_calls``, and tokens exceed ``max_tokens`` only by the error of the
backends' prompt counts (zero for vLLM, whose count is its tokenizer's).

Seeds: a request's ``seed`` is not sent unchanged to every call, or the
identical calls of a strategy (best-of-n re-solves, committee members, the n
choices of a request) would all return the same sample on a backend that
honours seeds. Each call gets its own seed, derived from the request's seed
and the call's place in the run: its strategy, step and prompt, and how many
identical calls came before it (``derive_seed``). Nothing depends on timing,
so a rerun with the same seed makes the same calls with the same seeds; among
concurrent calls with identical prompts only the order can differ.

Example:
    >>> ctx = Context(backend, budget=Budget(max_calls=8))  # doctest: +SKIP
    >>> gen = await ctx.generate([Message(role="user", content="2+2?")],  # doctest: +SKIP
    ...                          step="draft", strategy="cot")
    >>> gen[0].text, gen.event_id  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from refinery.engine.backends.base import Backend
from refinery.engine.errors import BudgetExhausted
from refinery.engine.stops import AnyRule, StopRule
from refinery.engine.trace import StepKind, Trace, TraceEvent
from refinery.engine.types import Completion, Delta, Message, SamplingParams, Task, Usage

LoopPolicy = Literal["off", "truncate", "retry"]
LOOP_NUDGE = "That went in circles. Stop repeating yourself and try a different approach."

EventListener = Callable[[TraceEvent], None]
# Gets the final answer as it is generated: each Delta's text, and its tokens'
# logprobs when the call asked for them.
DeltaSink = Callable[[Delta], Awaitable[None]]


class Budget(BaseModel):
    """Per-task limits. ``None`` means unlimited."""

    max_calls: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_seconds: float | None = Field(None, gt=0)


class Generation(list):
    """The completions of one traced call, plus the id of its trace event."""

    event_id: str = ""


class Context:
    """Per-task handle to the model, budget, trace and live event stream."""

    def __init__(self, backend: Backend, *, task: Task | None = None,
                 budget: Budget | None = None, trace: Trace | None = None,
                 params: SamplingParams | None = None,
                 loop_detector: StopRule | None = None,
                 loop_policy: LoopPolicy = "retry",
                 verifier: Any = None, listener: EventListener | None = None,
                 final_sink: DeltaSink | None = None, stop_rule: StopRule | None = None):
        self.backend = backend
        self.task = task
        self.budget = budget or Budget()
        self.trace = trace if trace is not None else Trace(task_id=task.id if task else "")
        self.params = params or SamplingParams()
        self.loop_detector = loop_detector if loop_policy != "off" else None
        self.loop_policy = loop_policy
        self.verifier = verifier
        self.listener = listener
        self.final_sink = final_sink
        # A strategy's own stop rule for every call of this view (``fork(stop_rule=...)``);
        # a call's ``stop_rule`` argument replaces it. Both run beside the loop detector.
        self.stop_rule = stop_rule
        self.usage = Usage()
        self._reserved = Usage()  # worst cases of the calls in flight (root only)
        self.started = time.monotonic()
        self._seen: Counter[str] = Counter()  # calls per place, for their seeds (root only)
        self._shared = self  # inner contexts account into the root

    def inner(self) -> Context:
        """A view for an inner strategy: same budget, trace and usage, but its
        generations are not the user-visible final answer."""
        return self.fork(final_sink=None)

    def fork(self, **overrides: Any) -> Context:
        """A view sharing this context's budget and usage, with some attributes
        replaced (e.g. its own ``trace`` and ``final_sink`` for one of n choices)."""
        child = object.__new__(Context)
        child.__dict__.update(self.__dict__)
        child.__dict__.update(overrides)
        return child

    # -- budget -------------------------------------------------------------------------

    @property
    def spent(self) -> Usage:
        return self._shared.usage

    def remaining_seconds(self) -> float | None:
        if self.budget.max_seconds is None:
            return None
        return self.budget.max_seconds - (time.monotonic() - self._shared.started)

    @property
    def reserved(self) -> Usage:
        """What the calls in flight may still spend (their admitted worst cases)."""
        return self._shared._reserved

    def _admit(self, messages: Sequence[Message], params: SamplingParams,
               n: int) -> tuple[SamplingParams, Usage]:
        """Refuse a call the budget cannot afford, or reserve its worst case.

        ``max_tokens`` is shrunk so that the prompt and ``n`` samples fit the
        room left by what is spent and what the calls in flight have reserved.

        Returns:
            The (possibly shrunk) params and the reservation, which the caller
            must hand to ``_settle`` when the call ends, however it ends.

        Raises:
            BudgetExhausted: no room for one more call.
        """
        u, r, b = self.spent, self.reserved, self.budget
        if b.max_calls is not None and u.calls + r.calls + 1 > b.max_calls:
            raise BudgetExhausted(f"call budget of {b.max_calls} spent")
        left = self.remaining_seconds()
        if left is not None and left <= 0:
            raise BudgetExhausted(f"time budget of {b.max_seconds}s spent")
        prompt = 0
        if b.max_tokens is not None:
            room = b.max_tokens - u.total_tokens - r.total_tokens
            if room <= 0:
                raise BudgetExhausted(f"token budget of {b.max_tokens} spent")
            # Parallel samples share one prompt; it is counted once, as in _account.
            prompt = self.backend.count_tokens(messages)
            per_sample = (room - prompt) // n
            if per_sample < 1:
                raise BudgetExhausted(
                    f"token budget of {b.max_tokens} spent: {room} tokens left, too few "
                    f"for a {prompt}-token prompt and {n} sample(s)")
            if per_sample < params.max_tokens:
                params = params.but(max_tokens=per_sample)
        hold = Usage(prompt_tokens=prompt, completion_tokens=n * params.max_tokens, calls=1)
        self._shared._reserved = self.reserved + hold
        return params, hold

    def _settle(self, hold: Usage, comps: Sequence[Completion] | None) -> Usage:
        """Release a call's reservation and account what it really used.

        ``comps`` is None for a call that failed or was cancelled: it still
        counts as a call (the engine got it), but its tokens are unknown.
        """
        root = self._shared
        r = root._reserved
        root._reserved = Usage(prompt_tokens=r.prompt_tokens - hold.prompt_tokens,
                               completion_tokens=r.completion_tokens - hold.completion_tokens,
                               calls=r.calls - hold.calls)
        if comps is None:
            used = Usage(calls=1)
            root.usage = root.usage + used
            return used
        return self._account(comps)

    def _account(self, comps: Sequence[Completion]) -> Usage:
        # Parallel samples share one prompt: count it once, as vLLM computes it once
        # (and its cached part with it).
        used = Usage(prompt_tokens=comps[0].prompt_tokens if comps else 0,
                     completion_tokens=sum(c.completion_tokens for c in comps), calls=1,
                     cached_tokens=comps[0].cached_tokens if comps else None)
        self._shared.usage = self._shared.usage + used
        return used

    async def _timed(self, aw: Awaitable[Any]) -> Any:
        left = self.remaining_seconds()
        if left is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, timeout=left)
        except TimeoutError as exc:
            raise BudgetExhausted(f"time budget of {self.budget.max_seconds}s spent") from exc

    # -- model calls --------------------------------------------------------------------

    async def generate(self, messages: Sequence[Message], params: SamplingParams | None = None,
                       *, n: int | None = None, step: StepKind = "draft", strategy: str = "",
                       parents: Sequence[str] = (), final: bool = False,
                       stop_rule: StopRule | None = None,
                       continue_final: bool = False) -> Generation:
        """Sample ``n`` completions of ``messages`` (traced, budgeted, loop-watched).

        ``final=True`` marks the user-visible answer: with a live sink and n=1 the
        text is streamed to the client token by token as it is generated.
        ``stop_rule`` (default: this context's ``stop_rule``) watches every sample
        beside the loop detector and may end it early (engine/stops.py).
        ``continue_final=True`` continues the last message, a partial assistant
        turn (engine/backends/base.py); a loop in such a sample is cut, not retried.

        Raises:
            BudgetExhausted: the call does not fit the remaining budget.
        """
        params = self._seeded(params or self.params, messages, strategy, step)
        n = params.n if n is None else n
        params, hold = self._admit(messages, params, n)
        rule = stop_rule if stop_rule is not None else self.stop_rule
        t0 = time.monotonic()
        streamed = final and self.final_sink is not None and n == 1
        # Only a continuation passes the keyword: a Backend written before it keeps
        # working for every other call.
        cont = {"continue_final": True} if continue_final else {}
        comps = None
        try:
            if streamed:
                comps = [await self._timed(self._stream_final(messages, params, rule, cont))]
            else:
                comps = await self._timed(self.backend.generate(
                    messages, params, n=n, stop_rule=self._call_rule(params, rule), **cont))
        finally:
            # Also on an error or a cancellation (the deadline, a client gone):
            # a reservation left behind would shrink the budget for good.
            used = self._settle(hold, comps)
        gen = Generation(comps)
        gen.event_id = self.record(TraceEvent(
            kind="generation", step=step, strategy=strategy, parents=list(parents),
            seconds=time.monotonic() - t0, messages=list(messages),
            params=params.model_dump(exclude_defaults=True), completions=comps, usage=used,
            data={**({"final": True} if streamed else {}),
                  **({"continue_final": True} if continue_final else {})}))
        # A streamed final answer is already on the client's screen: a retry
        # would contradict it, so there the loop is only truncated.
        if (self.loop_policy == "retry" and not streamed and not continue_final
                and any(c.finish_reason == "loop" for c in comps)):
            gen = await self._retry_loops(messages, params, gen, strategy, rule)
        return gen

    async def _stream_final(self, messages: Sequence[Message], params: SamplingParams,
                            rule: StopRule | None, cont: dict) -> Completion:
        assert self.final_sink is not None
        last = None
        stream = self.backend.stream(messages, params,
                                     stop_rule=self._call_rule(params, rule), **cont)
        try:
            async for delta in stream:
                if delta.text or delta.reasoning or delta.tool_calls or delta.logprobs:
                    await self.final_sink(delta)
                last = delta
        finally:
            # Cancelled while awaiting the sink, the stream would otherwise stay
            # suspended until garbage-collected, its engine request still running;
            # closing it aborts the request now.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        assert last is not None and last.completion is not None
        return last.completion

    async def _retry_loops(self, messages: Sequence[Message], params: SamplingParams,
                           gen: Generation, strategy: str,
                           rule: StopRule | None) -> Generation:
        """One retry per looping sample, with the cut text and a nudge in context."""
        used = Usage()

        async def retry(c: Completion) -> Completion:
            nonlocal used
            if c.finish_reason != "loop":
                return c
            turn = [*messages, Message(role="assistant", content=c.text),
                    Message(role="user", content=LOOP_NUDGE)]
            try:
                p, hold = self._admit(turn, self._seeded(params, turn, strategy, "loop_retry"), 1)
            except BudgetExhausted:
                return c
            out = None
            try:
                out = await self._timed(self.backend.generate(
                    turn, p, n=1, stop_rule=self._call_rule(p, rule)))
            finally:
                used = used + self._settle(hold, out)
            return out[0]

        comps = await asyncio.gather(*(retry(c) for c in gen))
        retried = [c for c, old in zip(comps, gen, strict=True) if c is not old]
        out = Generation(comps)
        out.event_id = self.record(TraceEvent(
            kind="generation", step="loop_retry", strategy=strategy, parents=[gen.event_id],
            completions=retried, usage=used, data={"nudge": LOOP_NUDGE}))
        return out

    def _call_rule(self, params: SamplingParams,
                   rule: StopRule | None = None) -> StopRule | None:
        """The stop rule of a call: the loop detector (none on a constrained call) and
        ``rule``, as one (``AnyRule.of``: a lone rule is passed as it is).

        Constrained output repeats its structure by design (the same keys in
        every list item, one line per candidate), which the CUSUM detector reads
        as a loop: it cut 37 of 60 SSR decompositions mid-JSON on arith. The
        constraint's own bounds (maxItems, maxLength, bounded regex repeats)
        cap such a sample's length instead. A strategy's own rule applies anyway.
        """
        loops = None if params.constraint is not None else self.loop_detector
        return AnyRule.of(loops, rule)

    def _seeded(self, params: SamplingParams, messages: Sequence[Message], strategy: str,
                step: str) -> SamplingParams:
        """``params`` with this call's affinity (its task) and own seed (when the run has one)."""
        if params.affinity is None and self.task is not None:
            params = params.but(affinity=self.task.id)
        if params.seed is None:
            return params
        place = derive_place(messages, strategy, step)
        seen = self._shared._seen
        occurrence = seen[place]
        seen[place] += 1
        return params.but(seed=derive_seed(params.seed, place, occurrence))

    # -- events -------------------------------------------------------------------------

    def record(self, event: TraceEvent) -> str:
        eid = self.trace.add(event)
        if self.listener is not None:
            # Listeners are live views (the server's reasoning stream); they must
            # not block the strategy, so they are plain callbacks (queue puts).
            self.listener(event)
        return eid

    def emit(self, step: StepKind, text: str = "", *, strategy: str = "",
             parents: Sequence[str] = (), **data: Any) -> str:
        """Record a strategy step (a vote, a critique's scores, a chosen candidate)."""
        return self.record(TraceEvent(kind="step", step=step, strategy=strategy,
                                      parents=list(parents), text=text, data=data))


def derive_place(messages: Sequence[Message], strategy: str, step: str) -> str:
    """A digest of what makes a call what it is: strategy, step and prompt."""
    h = hashlib.sha256(f"{strategy}\x00{step}".encode())
    for m in messages:
        h.update(f"\x00{m.role}\x00{m.content}".encode())
    return h.hexdigest()


def derive_seed(seed: int, place: str, occurrence: int) -> int:
    """A call's seed: a 63-bit hash of the run's seed, the call's place and occurrence.

    Example:
        >>> derive_seed(1234, "ab", 0) != derive_seed(1234, "ab", 1)
        True
    """
    digest = hashlib.sha256(f"{seed}\x00{place}\x00{occurrence}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
