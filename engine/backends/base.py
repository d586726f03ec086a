"""The Backend protocol: the only way refinery talks to a model.

A backend is async and batches by concurrency: many coroutines call
``generate`` at once and the engine (vLLM's continuous batching, or an
upstream server) batches them. Cancelling the calling task aborts the request.

``continue_final=True`` continues the last message, a partial assistant turn,
instead of starting a new one (vLLM's ``continue_final_message``): the sample
is only the continuation. Code execution inside the reasoning and step-level
search both write part of an answer and let the model go on from there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from refinery.engine.errors import InvalidRequestError
from refinery.engine.stops import StopRule
from refinery.engine.types import Completion, Delta, Message, SamplingParams


@runtime_checkable
class Backend(Protocol):
    """What every model adapter provides.

    ``stop_rule`` (engine/stops.py) watches every sample through a fresh monitor,
    the backend fetching the top-k logprobs the rule needs, and ends a sample
    the monitor stops: finish_reason ``loop`` with the text cut at the loop's
    onset, ``confidence`` with the text kept; ``completion_tokens`` counts every
    token generated, ``measures`` keeps what the monitor measured. How a call's
    samples are run under a rule is ``fan_out``'s (engine/backends/fan_out.py).

    The health members are what the server reads for /health and its
    on-engine-death policy: ``healthy`` can come back (an upstream that answers
    again), ``dead`` cannot (the engine process is gone; only a new backend helps).
    """

    model: str
    max_model_len: int
    # Constraint kinds (engine/constraints.py) this backend enforces; a call with any
    # other kind raises UnsupportedConstraintError instead of answering in free text.
    structured_outputs: frozenset[str]
    # Whether ``continue_final=True`` works; a call that needs it on a backend
    # without raises ContinuationUnsupportedError (see ``require_continuation``).
    continues_messages: bool
    # The parsers that split each completion into thinking, answer and native tool
    # calls (engine/completion_parts.py), by vLLM's names; None: none configured, or
    # (an upstream) unknown. The split's results are Completion.reasoning/tool_calls.
    reasoning_parser: str | None
    tool_call_parser: str | None

    @property
    def healthy(self) -> bool:
        """True while the backend can serve requests."""
        ...

    @property
    def dead(self) -> bool:
        """True once the backend is gone for good; it never turns False again."""
        ...

    @property
    def status(self) -> str:
        """``"ok"``, or why the backend is not healthy (for /health)."""
        ...

    async def check_health(self) -> bool:
        """Probe the model now (an upstream's reachability) and return ``healthy``."""
        ...

    async def generate(self, messages: Sequence[Message], params: SamplingParams, *,
                       n: int | None = None,
                       stop_rule: StopRule | None = None,
                       continue_final: bool = False) -> list[Completion]:
        """``n`` samples (default ``params.n``) of one prompt, in order."""
        ...

    def stream(self, messages: Sequence[Message], params: SamplingParams, *,
               stop_rule: StopRule | None = None,
               continue_final: bool = False) -> AsyncIterator[Delta]:
        """One sample, streamed; the last Delta carries the whole Completion."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Prompt tokens of ``messages`` after the chat template."""
        ...

    async def aclose(self) -> None: ...


class ContinuationUnsupportedError(InvalidRequestError):
    """The backend cannot continue a partial assistant message (an OpenAI-style
    upstream that is not a vLLM server has no such request field)."""

    def __init__(self, backend: str):
        super().__init__(
            f"{backend} cannot continue a partial assistant message, which this "
            "strategy needs; use the in-process vLLM backend or a vLLM server "
            "upstream (--backend vllm-server)", code="continuation_unsupported")


def require_continuation(backend: object, name: str = "") -> None:
    """Raise ``ContinuationUnsupportedError`` unless ``backend`` can continue a
    partial assistant message; a backend that does not say cannot."""
    if not getattr(backend, "continues_messages", False):
        raise ContinuationUnsupportedError(name or type(backend).__name__)


def check_continuable(messages: Sequence[Message]) -> None:
    """A continuation needs a last message that is the assistant's."""
    if not messages or messages[-1].role != "assistant":
        raise InvalidRequestError("continue_final needs the last message to be the "
                                  "assistant's partial turn", param="messages")
