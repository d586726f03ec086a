"""VLLMBackend.aclose(): what a closed backend does, on a stand-in for AsyncLLM.

The real engine's close is covered end to end by tests/eval/test_sigterm.py (a
rerun of `refinery eval run` must exit without a teardown traceback); this checks
the backend's side of it without starting vLLM.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from engine.backends.vllm import VLLMBackend
from engine.errors import BackendUnavailableError
from engine.types import Message, SamplingParams


class StandInEngine:
    """The few AsyncLLM attributes the backend touches; counts shutdown() calls."""

    def __init__(self) -> None:
        self.errored = False
        self.shutdowns = 0
        self.me = self  # a reference cycle, as AsyncLLM has: freed by gc, not refcount

    def shutdown(self) -> None:
        self.shutdowns += 1

    def get_num_unfinished_requests(self) -> int:
        return 3


class StandInTokenizer:
    def apply_chat_template(self, chat, tokenize, add_generation_prompt) -> str:
        return " ".join(m["content"] for m in chat)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [1] * len(text.split())


async def test_close_shuts_down_once_releases_the_engine_and_refuses_requests() -> None:
    engine = StandInEngine()
    backend = VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True)
    assert (backend.dead, backend.status, backend.num_unfinished_requests()) == (False, "ok", 3)
    ref = weakref.ref(engine)
    del engine

    await backend.aclose()
    await backend.aclose()  # a second close (server shutdown after a restart) is a no-op
    assert ref() is None, "the closed backend still holds its engine"
    assert (backend.dead, backend.healthy, backend.status) == (True, False, "closed")
    assert backend.num_unfinished_requests() == 0
    with pytest.raises(BackendUnavailableError, match="closed"):
        await backend.generate([Message(role="user", content="2+2?")], SamplingParams())


async def test_the_engine_is_shut_down_exactly_once() -> None:
    engine = StandInEngine()
    backend = VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True)
    await backend.aclose()
    await backend.aclose()
    gc.collect()
    assert engine.shutdowns == 1
