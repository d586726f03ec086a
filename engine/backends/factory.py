"""One way to build a backend from what a user asked for, for every command.

``refinery generate/solve/serve``, ``refinery eval run`` and ``refinery distill
loop`` all describe the backend they want as a :class:`BackendSpec` and call
:func:`make_backend`; the adapters stay importable on their own.

Example:
    >>> local = BackendSpec(model="smollm2-135m", dtype="float32")
    >>> backend = await make_backend(local)  # doctest: +SKIP
    >>> remote = BackendSpec(kind="openai", base_url=("http://h:8000/v1",))
    >>> upstream = await make_backend(remote)  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum

from refinery.engine.backends.base import Backend
from refinery.engine.errors import InvalidRequestError
from refinery.engine.models import DEFAULT_MODEL


class BackendKind(str, Enum):
    """Where generations run: an in-process vLLM engine, or an OpenAI-compatible server.

    ``vllm-server`` is an OpenAI-compatible server known to be vLLM's: it also
    enforces regex, choice and grammar constraints (any server takes JSON ones).
    """

    vllm = "vllm"
    openai = "openai"
    vllm_server = "vllm-server"


@dataclass(frozen=True)
class BackendSpec:
    """The backend a command asked for.

    ``dtype`` and ``compile_graph`` only concern the in-process engine: ``auto``
    picks what this CPU computes natively (see ``refinery.engine.hardware``).
    """

    model: str = DEFAULT_MODEL
    kind: BackendKind = BackendKind.vllm
    base_url: tuple[str, ...] = ()
    api_key: str | None = None  # default: $OPENAI_API_KEY, else "EMPTY"
    max_concurrency: int = 64  # requests in flight to an upstream
    dtype: str = "auto"
    compile_graph: bool = False  # vLLM's torch.compile mode instead of eager
    # The CPUs the engine's compute threads bind to ("0,1"; None: all this process
    # may use): how engines sharing one CPU node split it (refinery.eval.ray_pool).
    cpu_threads: str | None = None
    tensor_parallel_size: int = 1  # GPUs one engine spans (vLLM's tensor parallelism)
    # The in-process engine's parsers of the model's thinking and native tool calls
    # (VLLMConfig's, by vLLM's names).
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None


async def make_backend(spec: BackendSpec) -> Backend:
    """Build and start the backend ``spec`` names.

    Raises:
        InvalidRequestError: an OpenAI backend without a base URL.
        UnknownModelError, EngineStartError: the in-process engine could not start.
    """
    kind = BackendKind(spec.kind)
    if kind is not BackendKind.vllm:
        from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig

        if not spec.base_url:
            raise InvalidRequestError(f"--backend {kind.value} needs --base-url",
                                      param="base_url")
        return OpenAIBackend(spec.model, list(spec.base_url),
                             api_key=spec.api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
                             config=OpenAIConfig(
                                 max_concurrency=spec.max_concurrency,
                                 upstream="vllm" if kind is BackendKind.vllm_server
                                 else "openai"))
    from refinery.engine.backends.vllm import VLLMBackend, VLLMConfig

    extra = (("tensor_parallel_size", spec.tensor_parallel_size),) \
        if spec.tensor_parallel_size > 1 else ()
    config = VLLMConfig(enforce_eager=not spec.compile_graph, dtype=spec.dtype,
                        cpu_threads=spec.cpu_threads, extra=extra,
                        reasoning_parser=spec.reasoning_parser,
                        tool_call_parser=spec.tool_call_parser)
    return await VLLMBackend.create(spec.model, config)
