"""What the routes call: resolve a request to a strategy, run its choices.

A request's ``model`` is ``SPEC@MODEL`` (``ssr@`` and the served model), a preset name
with ``@MODEL``, or the plain served model (passthrough, or the server's
default strategy). OptiLLM's forms work too (``serving.optillm``):
``APPROACH-MODEL`` (``moa-smollm2-135m``) and ``optillm_approach`` in the body.
``refinery.strategy`` in the body overrides them all.

Under a strategy, sampling fields have these meanings: ``temperature``,
``top_p`` and ``stop`` are the defaults for the strategy's generations (steps
with their own temperature, like SSR's greedy decomposition, keep it);
``max_tokens`` caps each internal generation; ``n`` runs the strategy n times
independently, sharing the request's budget; ``seed`` is passed to every call
(ignored by the vLLM CPU backend, where a per-request seed crashes the engine).

Output shape (``serving.structured``): on passthrough the one generation
carries the request's constraint (``response_format``, vLLM's fields, a forced
tool call) and logprobs. Under a strategy the constraint is the run's
``final_constraint``: the strategy solves freely (its steps keep their own
constraints), then one greedy constrained call turns its solution into the
shape (``engine.run.conform``); that call is the answer, streamed as content,
and the solution is the reasoning. A turn whose answer may be a tool call
(``tool_choice`` ``"auto"`` or ``"required"``) is the exception: the strategy's
tool-turn form (``strategies.registry.tool_turn_form``) draws every sample under the call's
constraint and votes on the calls themselves (equal calls written differently
count as one, ``engine.tool_calls.turn_key``). Logprobs under a strategy are those of the
sample that became the answer (the constrained call, or the strategy's own
sample when its answer is one sample's text), else null.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from refinery.engine.backends.base import Backend
from refinery.engine.constraints import Constraint, require_support
from refinery.engine.context import Budget, Context, LoopPolicy
from refinery.engine.errors import (
    BackendUnavailableError,
    BudgetError,
    BudgetExhausted,
    InvalidRequestError,
    PromptTooLongError,
    SpecError,
    UnknownModelError,
)
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.run import EXHAUSTED, ChoiceListener, ChoiceSink, Solver, solve_choices
from refinery.engine.tool_calls import Call
from refinery.engine.trace import Trace
from refinery.engine.types import Attempt, Message, SamplingParams, Task, Usage
from refinery.serving import optillm
from refinery.serving.config import EffortLevel, ServerConfig
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    RefineryBudget,
    RefineryOptions,
)
from refinery.serving.structured import Output, Reply, content_text, message_text, output_of
from refinery.strategies import build_with_graph
from refinery.strategies.registry import tool_turn_form
from refinery.strategies.spec import MAX_SPEC_CHARS, to_spec


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

    strategy: Solver
    spec: str | None
    task: Task
    params: SamplingParams
    budget: Budget
    n: int
    loop_policy: LoopPolicy
    trace_mode: Literal["none", "summary", "full"]
    reply: Reply = field(default_factory=Reply)
    final_constraint: Constraint | None = None  # under a strategy: the answer's shape


@dataclass
class Outcome:
    """A finished run: one trace per choice, the shared usage, the wall time."""

    traces: list[Trace]
    usage: Usage
    seconds: float


class Service:
    """Holds the backend (once ready) and turns requests into strategy runs.

    Example:
        >>> service = Service(ServerConfig(), backend)  # doctest: +SKIP
        >>> outcome = await service.run(service.prepare(request))  # doctest: +SKIP
    """

    def __init__(self, config: ServerConfig, backend: Backend | None = None):
        self.config = config
        self.backend = backend
        self.start_error: str | None = None
        self.detector = CusumLoopDetector() if config.loop_detection else None

    # -- readiness ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.backend is not None and self.backend.healthy

    @property
    def not_ready_reason(self) -> str:
        """Why /health is 503: the start failure, still starting, or the backend's status."""
        if self.start_error:
            return self.start_error
        return self.backend.status if self.backend is not None else "starting"

    def require_backend(self) -> Backend:
        if self.backend is None:
            why = f": {self.start_error}" if self.start_error else " (still starting)"
            raise BackendUnavailableError(f"the model engine is not ready{why}")
        if not self.backend.healthy:
            raise BackendUnavailableError("the model engine has died")
        return self.backend

    # -- preparation --------------------------------------------------------------------

    def resolve_spec(self, model_field: str, override: str | None = None,
                     approach: str | None = None,
                     effort: str | None = None) -> tuple[str | None, EffortLevel | None]:
        """The strategy spec a request asks for (None = passthrough), and the effort
        level that chose it (None: something else did).

        ``model_field`` is ``SPEC@MODEL``, ``PRESET@MODEL``, OptiLLM's
        ``APPROACH-MODEL`` or the served model; ``approach`` is OptiLLM's
        ``optillm_approach`` and ``override`` ``refinery.strategy``, which wins
        over both. Only when none of them names a strategy does ``effort`` (a
        ``reasoning_effort`` level) pick one, then the server's default strategy.
        OptiLLM's ``none`` is passthrough even with a default strategy or an effort.
        """
        spec = self.spec_in_model(model_field)
        if approach is not None and approach.strip() != optillm.AUTO:
            spec = optillm.spec_of(approach, param="optillm_approach")
        spec = override or spec
        if spec == optillm.PASSTHROUGH:
            return None, None
        level = self.effort_level(effort) if not spec and effort is not None else None
        if level is not None:
            spec = level.spec
            if spec is None:
                return None, level
        spec = spec or self.config.default_strategy
        if not spec:
            return None, None
        if len(spec) > MAX_SPEC_CHARS:
            # Before the preset lookup strips it: "cot" + 100 kB of spaces is no preset.
            raise SpecError(f"strategy spec of {len(spec)} characters is longer than "
                            f"{MAX_SPEC_CHARS} characters", param="strategy")
        return self.config.presets.get(spec.strip(), spec), level

    def effort_level(self, effort: str) -> EffortLevel:
        level = self.config.effort.get(effort)
        if level is None:
            raise InvalidRequestError(f"reasoning_effort {effort!r} is not mapped on this "
                                      f"server (mapped: {', '.join(self.config.effort)})",
                                      param="reasoning_effort")
        return level

    def spec_in_model(self, model_field: str) -> str | None:
        """The spec the model field names: ``SPEC@`` or an OptiLLM prefix (None: none).

        Raises:
            UnknownModelError: the field names no form of the served model.
            SpecError: an OptiLLM approach refinery does not run.
        """
        served = self.config.model
        spec, sep, model = model_field.rpartition("@")
        if sep and model == served:
            return spec or None
        if not sep and model_field == served:
            return None
        approach = None if sep else optillm.approach_of(model_field, served)
        if approach is not None:
            return optillm.spec_of(approach)
        presets = ", ".join(f"{p}@{served}" for p in self.config.presets)
        raise UnknownModelError(
            f"model {model!r} is not served here. Available: "
            f"{served} (passthrough), SPEC@{served} for any strategy spec, presets: "
            f"{presets}, and OptiLLM's APPROACH-{served} for "
            f"{', '.join(a for a in optillm.APPROACHES if a != 'none')}",
            param="model", code="model_not_found")

    def prepare(self, req: ChatCompletionRequest | CompletionRequest,
                task_id: str = "task") -> Prepared:
        """Validate a request against the served model and the limits; build its run
        (``task_id``: the request's id, which its trace and calls carry)."""
        backend = self.require_backend()
        opts = req.refinery or RefineryOptions()
        spec, level = self.resolve_spec(req.model, opts.strategy, req.optillm_approach,
                                        req.reasoning_effort)
        strategy, canonical = self.build(spec)
        out = output_of(req, native=self.native_auto(req, backend, spec))
        # A turn that may answer with a tool call: every sample is drawn under the call's
        # constraint and the strategy votes on (or scores) the samples themselves.
        tool_turn = spec is not None and out.reply.tools in ("auto", "required")
        if tool_turn:
            strategy = tool_turn_form(strategy)
            canonical = repr(strategy)
        if out.constraint is not None:
            require_support(out.constraint, backend.structured_outputs, backend_name(backend))
        messages, max_tokens = conversation(req, self.config.max_messages,
                                            real_turns=parses_calls(backend))
        messages = with_system(messages, out.tools_prompt)
        if out.tools_example:  # right after the system turn with_system made
            messages = [messages[0], *out.tools_example, *messages[1:]]
        n_prompt = backend.count_tokens(messages)
        if n_prompt >= backend.max_model_len:
            raise PromptTooLongError(
                f"prompt is {n_prompt} tokens; the model's context window is "
                f"{backend.max_model_len} tokens", param="messages",
                code="context_length_exceeded")
        policy = opts.loop_policy or ("off" if spec is None else self.config.loop_policy)
        params = self.sampling(req, max_tokens, out, constrained=spec is None or tool_turn)
        return Prepared(strategy=strategy, spec=canonical, task=Task(id=task_id, messages=messages),
                        params=params, n=req.n,
                        budget=self.budget(opts.budget, level.max_tokens if level else None),
                        loop_policy=policy, trace_mode=opts.trace, reply=out.reply,
                        final_constraint=None if spec is None or tool_turn else out.constraint)

    def native_auto(self, req: ChatCompletionRequest | CompletionRequest, backend: Backend,
                    spec: str | None) -> bool:
        """Whether ``"auto"`` is the model's own tool calls: a passthrough turn over a
        backend that parses them, with ``enable_auto_tool_choice`` (under a strategy the
        samples are drawn in the envelope, whose calls its votes compare).

        Raises:
            InvalidRequestError: ``"auto"`` over a parsing backend without the switch,
                as vLLM's server refuses it.
        """
        auto = (isinstance(req, ChatCompletionRequest) and bool(req.tools)
                and req.tool_choice in (None, "auto"))
        if not auto or not parses_calls(backend):
            return False
        if not self.config.enable_auto_tool_choice:
            raise InvalidRequestError('"auto" tool choice requires --enable-auto-tool-choice '
                                      "and --tool-call-parser to be set", param="tool_choice")
        return spec is None

    def build(self, spec: str | None) -> tuple[Solver, str | None]:
        """The strategy for ``spec`` and its canonical spelling (passthrough: None)."""
        if spec is None:
            return Passthrough(), None
        strategy, graph = build_with_graph(spec, max_calls=self.config.max_spec_calls)
        return strategy, to_spec(graph)

    def sampling(self, req: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                 out: Output, *, constrained: bool) -> SamplingParams:
        """The request's sampling fields, with the server's defaults for the unset ones.

        Only a passthrough call or a tool turn carries the constraint (a strategy
        gets any other as its run's final constraint, so its own steps stay free).
        """
        cfg = self.config
        return SamplingParams(
            temperature=cfg.default_temperature if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            max_tokens=max_tokens or cfg.default_max_tokens, stop=req.stop, seed=req.seed,
            logprobs=out.logprobs, top_logprobs=out.top_logprobs,
            constraint=out.constraint if constrained else None,
            thinking_token_budget=req.thinking_token_budget, tools=list(out.tools) or None)

    def budget(self, asked: RefineryBudget | None, effort_tokens: int | None = None) -> Budget:
        """The request's budget: the server's caps, lowered where the request asks (or,
        for tokens it does not set, to its effort level's budget)."""
        cfg = self.config
        caps = {"max_tokens": cfg.max_request_tokens, "max_calls": cfg.max_request_calls,
                "max_seconds": cfg.max_request_seconds}
        out = dict(caps)
        if effort_tokens is not None:
            out["max_tokens"] = min(effort_tokens, cfg.max_request_tokens)
        for key, cap in caps.items():
            value = getattr(asked, key) if asked is not None else None
            if value is None:
                continue
            if value > cap:
                raise BudgetError(f"refinery.budget.{key}={value} is above this server's "
                                  f"limit of {cap}", param=f"refinery.budget.{key}")
            out[key] = value
        return Budget(**out)

    # -- execution ----------------------------------------------------------------------

    async def run(self, prep: Prepared, listener: ChoiceListener | None = None,
                  sink: ChoiceSink | None = None) -> Outcome:
        """Run the n choices concurrently on one shared budget (``engine.run``'s path)."""
        backend = self.require_backend()
        t0 = time.monotonic()
        try:
            traces = await solve_choices(
                prep.strategy, prep.task, backend, n=prep.n, budget=prep.budget,
                params=prep.params, loop_detector=self.detector, loop_policy=prep.loop_policy,
                listener=listener, final_sink=sink, spec=prep.spec or "passthrough",
                trace_ids=[str(i) for i in range(prep.n)], on_exhausted="raise",
                final_constraint=prep.final_constraint)
        except BudgetExhausted as exc:
            raise BudgetExhausted(f"{EXHAUSTED}: {exc}", param="refinery.budget") from exc
        return Outcome(traces=traces, usage=traces[0].usage, seconds=time.monotonic() - t0)


def parses_calls(backend: Backend) -> bool:
    """Whether ``backend`` parses the model's native tool calls (a tool-call parser)."""
    return getattr(backend, "tool_call_parser", None) is not None


def conversation(req: ChatCompletionRequest | CompletionRequest, max_messages: int,
                 real_turns: bool = False) -> tuple[list[Message], int | None]:
    """The messages a request sends the model, and the max_tokens it asks for
    (``real_turns``: tool calls and results as the template's own turns)."""
    if isinstance(req, ChatCompletionRequest):
        if len(req.messages) > max_messages:
            raise InvalidRequestError(
                f"{len(req.messages)} messages; at most {max_messages} are accepted",
                param="messages")
        names: dict[str, str] = {}  # tool call id -> function name, in conversation order
        return ([to_message(m, names, real_turns) for m in req.messages],
                req.max_completion_tokens or req.max_tokens)
    prompt = req.prompt
    if not isinstance(prompt, str):
        if len(prompt) != 1:
            raise InvalidRequestError("only one prompt per request is supported",
                                      param="prompt")
        prompt = prompt[0]
    return [Message(role="user", content=prompt)], req.max_tokens


def to_message(m: ChatMessage, names: dict[str, str], real_turns: bool = False) -> Message:
    """A chat message as the engine's Message: a tool result is a user turn and calls
    are text in the envelope, or (``real_turns``) the turns a tool template renders."""
    if real_turns and (m.tool_calls or m.role == "tool"):
        calls = [Call(c.function.name, call_arguments(c.function.arguments, "messages"))
                 for c in m.tool_calls or []] or None
        return Message(role=m.role, content=content_text(m), tool_calls=calls,
                       tool_call_id=m.tool_call_id)
    role = {"developer": "system", "tool": "user"}.get(m.role, m.role)
    return Message(role=role, content=message_text(m, names))


def call_arguments(text: str, param: str) -> dict[str, Any]:
    """An earlier call's arguments JSON as the object a template renders."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"a tool call's arguments are not JSON: {exc}",
                                  param=param) from exc
    if not isinstance(value, dict):
        raise InvalidRequestError("a tool call's arguments must be a JSON object",
                                  param=param)
    return value


def with_system(messages: list[Message], text: str | None) -> list[Message]:
    """``text`` added to the conversation's system turn (one is opened if none)."""
    if not text:
        return messages
    if messages and messages[0].role == "system":
        first = Message(role="system", content=f"{messages[0].content}\n\n{text}")
        return [first, *messages[1:]]
    return [Message(role="system", content=text), *messages]


def backend_name(backend: Backend) -> str:
    """How an error names a backend: ``VLLMBackend`` -> ``vllm``."""
    return type(backend).__name__.removesuffix("Backend").lower() or "model"


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
