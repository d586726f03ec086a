"""What the routes call: resolve a request to a strategy, run its choices.

A request's ``model`` is ``SPEC@MODEL`` (``ssr@smollm2-135m``), a preset name
with ``@MODEL``, or the plain served model (passthrough, or the server's
default strategy). ``refinery.strategy`` in the body overrides the spec.

Under a strategy, sampling fields have these meanings: ``temperature``,
``top_p`` and ``stop`` are the defaults for the strategy's generations (steps
with their own temperature, like SSR's greedy decomposition, keep it);
``max_tokens`` caps each internal generation; ``n`` runs the strategy n times
independently, sharing the request's budget; ``seed`` is passed to every call
(ignored by the vLLM CPU backend, where a per-request seed crashes the engine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from refinery.engine.backends.base import Backend
from refinery.engine.context import Budget, Context, TextSink
from refinery.engine.errors import (
    BackendUnavailableError,
    BudgetError,
    BudgetExhausted,
    InvalidRequestError,
    PromptTooLongError,
    SpecError,
    UnknownModelError,
)
from refinery.engine.graph import MAX_SPEC_CHARS, to_spec
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.trace import Trace, TraceEvent
from refinery.engine.types import Attempt, Message, SamplingParams, Task, Usage
from refinery.serving.config import ServerConfig
from refinery.serving.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from refinery.strategies import build_with_graph


class Passthrough:
    """No strategy: the conversation goes to the model as it is."""

    name = "passthrough"

    async def solve(self, task: Task, ctx: Context) -> Attempt:
        gen = await ctx.generate(task.messages, ctx.params, step="final",
                                 strategy=self.name, final=True)
        c = gen[0]
        return Attempt(text=c.text, finish_reason=c.finish_reason, strategy=self.name,
                       events=[gen.event_id])


@dataclass
class Prepared:
    """A validated request, ready to run."""

    strategy: Any
    spec: str | None
    task: Task
    params: SamplingParams
    budget: Budget
    n: int
    loop_policy: str
    trace_mode: str


@dataclass
class Outcome:
    traces: list[Trace]
    usage: Usage
    seconds: float


class Service:
    """Holds the backend (once ready) and turns requests into strategy runs."""

    def __init__(self, config: ServerConfig, backend: Backend | None = None):
        self.config = config
        self.backend = backend
        self.start_error: str | None = None
        self.in_flight = 0
        self.detector = CusumLoopDetector() if config.loop_detection else None

    # -- readiness ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        b = self.backend
        return b is not None and getattr(b, "healthy", True)

    def require_backend(self) -> Backend:
        if self.backend is None:
            why = f": {self.start_error}" if self.start_error else " (still starting)"
            raise BackendUnavailableError(f"the model engine is not ready{why}")
        if not getattr(self.backend, "healthy", True):
            raise BackendUnavailableError("the model engine has died")
        return self.backend

    # -- preparation --------------------------------------------------------------------

    def resolve_spec(self, model_field: str, override: str | None) -> str | None:
        """The strategy spec a request asks for (None = passthrough)."""
        served = self.config.model
        spec, sep, model = model_field.rpartition("@")
        if not sep:
            spec, model = "", model_field
        if model != served:
            presets = ", ".join(f"{p}@{served}" for p in self.config.presets)
            raise UnknownModelError(
                f"model {model!r} is not served here. Available: {served} (passthrough), "
                f"SPEC@{served} for any strategy spec, and presets: {presets}",
                param="model", code="model_not_found")
        spec = override or spec or self.config.default_strategy
        if not spec:
            return None
        if len(spec) > MAX_SPEC_CHARS:
            # Before the preset lookup strips it: "cot" + 100 kB of spaces is no preset.
            raise SpecError(f"strategy spec of {len(spec)} characters is longer than "
                            f"{MAX_SPEC_CHARS} characters", param="strategy")
        return self.config.presets.get(spec.strip(), spec)

    def prepare(self, req: ChatCompletionRequest | CompletionRequest) -> Prepared:
        backend = self.require_backend()
        cfg = self.config
        opts = req.refinery
        spec = self.resolve_spec(req.model, opts.strategy if opts else None)
        if spec is None:
            strategy, canonical = Passthrough(), None
        else:
            strategy, graph = build_with_graph(spec, max_calls=cfg.max_spec_calls)
            canonical = to_spec(graph)
        if isinstance(req, ChatCompletionRequest):
            if len(req.messages) > cfg.max_messages:
                raise InvalidRequestError(
                    f"{len(req.messages)} messages; at most {cfg.max_messages} are accepted",
                    param="messages")
            messages = [to_message(m) for m in req.messages]
            max_tokens = req.max_completion_tokens or req.max_tokens
        else:
            if not isinstance(req.prompt, str):
                if len(req.prompt) != 1:
                    raise InvalidRequestError("only one prompt per request is supported",
                                              param="prompt")
                req.prompt = req.prompt[0]
            messages = [Message(role="user", content=req.prompt)]
            max_tokens = req.max_tokens
        n_prompt = backend.count_tokens(messages)
        if n_prompt >= backend.max_model_len:
            raise PromptTooLongError(
                f"prompt is {n_prompt} tokens; the model's context window is "
                f"{backend.max_model_len} tokens", param="messages",
                code="context_length_exceeded")
        params = SamplingParams(
            temperature=cfg.default_temperature if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=max_tokens or cfg.default_max_tokens, stop=req.stop, seed=req.seed)
        policy = (opts.loop_policy if opts and opts.loop_policy else
                  ("off" if spec is None else cfg.loop_policy))
        return Prepared(strategy=strategy, spec=canonical, task=Task(messages=messages),
                        params=params, budget=self.budget(opts.budget if opts else None),
                        n=req.n, loop_policy=policy,
                        trace_mode=opts.trace if opts else "none")

    def budget(self, asked: Any) -> Budget:
        cfg = self.config
        caps = {"max_tokens": cfg.max_request_tokens, "max_calls": cfg.max_request_calls,
                "max_seconds": cfg.max_request_seconds}
        out = dict(caps)
        for key, cap in caps.items():
            value = getattr(asked, key, None) if asked is not None else None
            if value is None:
                continue
            if value > cap:
                raise BudgetError(f"refinery.budget.{key}={value} is above this server's "
                                  f"limit of {cap}", param=f"refinery.budget.{key}")
            out[key] = value
        return Budget(**out)

    # -- execution ----------------------------------------------------------------------

    async def run(self, prep: Prepared,
                  listener: Callable[[int, TraceEvent], None] | None = None,
                  sink: Callable[[int], TextSink] | None = None) -> Outcome:
        """Run the n choices concurrently on one shared budget."""
        backend = self.require_backend()
        t0 = time.monotonic()
        root = Context(backend, task=prep.task, budget=prep.budget, params=prep.params,
                       loop_detector=self.detector, loop_policy=prep.loop_policy)

        async def choice(i: int) -> Trace:
            trace = Trace(task_id=str(i), strategy=prep.spec or "passthrough",
                          model=backend.model)
            ctx = root.fork(
                trace=trace,
                listener=(lambda ev: listener(i, ev)) if listener else None,
                final_sink=sink(i) if sink else None)
            c0 = time.monotonic()
            try:
                trace.attempt = await prep.strategy.solve(prep.task, ctx)
            except BudgetExhausted as exc:
                raise BudgetExhausted(f"budget exhausted before any answer: {exc}",
                                      param="refinery.budget") from exc
            trace.seconds = time.monotonic() - c0
            return trace

        traces = await gather_or_cancel([choice(i) for i in range(prep.n)])
        usage = root.spent
        for t in traces:
            t.usage = usage
        return Outcome(traces=traces, usage=usage, seconds=time.monotonic() - t0)


async def gather_or_cancel(coros: list) -> list:
    """Like gather, but the first failure cancels the siblings (no orphan work)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def to_message(m: ChatMessage) -> Message:
    if isinstance(m.content, list):
        text = "".join(p.text or "" for p in m.content if p.type == "text")
    else:
        text = m.content or ""
    role = {"developer": "system", "tool": "user"}.get(m.role, m.role)
    return Message(role=role, content=text)


def loop_alarms(trace: Trace) -> int:
    return sum(1 for e in trace.events if e.kind == "generation"
               for c in (e.completions or []) if c.finish_reason == "loop")


def trace_summary(trace: Trace) -> dict[str, Any]:
    steps: dict[str, int] = {}
    for e in trace.events:
        steps[e.step] = steps.get(e.step, 0) + 1
    return {"strategy": trace.strategy, "events": len(trace.events), "steps": steps,
            "loop_alarms": loop_alarms(trace), "seconds": round(trace.seconds, 3),
            "answer": trace.attempt.answer if trace.attempt else None}
