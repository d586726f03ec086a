"""VLLMBackend.aclose(): what a closed backend does, on a stand-in for AsyncLLM.

The real engine's close is covered end to end by tests/eval/test_sigterm.py (a
rerun of `refinery eval run` must exit without a teardown traceback); this checks
the backend's side of it without starting vLLM.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from refinery.engine.backends.vllm import VLLMBackend
from refinery.engine.errors import BackendUnavailableError
from refinery.engine.types import Message, SamplingParams


class StandInEngine:
    """The few AsyncLLM attributes the backend touches; counts shutdown() calls."""

    def __init__(self, unfinished: int = 3) -> None:
        self.errored = False
        self.shutdowns = 0
        self.unfinished = unfinished
        self.me = self  # a reference cycle, as AsyncLLM has: freed by gc, not refcount

    def shutdown(self) -> None:
        self.shutdowns += 1

    def get_num_unfinished_requests(self) -> int:
        return self.unfinished


class EngineWithOutputTask(StandInEngine):
    """AsyncLLM's order: shutdown() stops the core (the output task, reading from it
    on the event loop, sees it go and logs a failure), then cancels that task."""

    def __init__(self, unfinished: int) -> None:
        super().__init__(unfinished)
        self.loop = asyncio.get_running_loop()
        self.core_gone = asyncio.Event()
        self.failures: list[str] = []
        self.output_handler = self.loop.create_task(self.read_outputs())

    async def read_outputs(self) -> None:
        await self.core_gone.wait()
        self.failures.append("AsyncLLM output_handler failed: EngineDeadError")

    def shutdown(self) -> None:  # runs in a worker thread, as aclose() calls it
        super().shutdown()
        self.loop.call_soon_threadsafe(self.core_gone.set)
        time.sleep(0.2)  # the core takes a moment to go; the loop runs meanwhile
        self.loop.call_soon_threadsafe(self.output_handler.cancel)


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


async def test_a_clean_close_stops_the_output_task_before_the_core() -> None:
    engine = EngineWithOutputTask(unfinished=0)
    await VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True).aclose()
    assert engine.shutdowns == 1
    assert engine.output_handler.cancelled()
    assert engine.failures == []  # no "output_handler failed" traceback at a clean exit


async def test_with_requests_in_flight_the_output_task_stays_to_fail_them() -> None:
    engine = EngineWithOutputTask(unfinished=2)
    await VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True).aclose()
    await asyncio.sleep(0)
    # Its error is what wakes the waiting requests, so it must see the core go.
    assert engine.failures == ["AsyncLLM output_handler failed: EngineDeadError"]


class StandInOutputProcessor:
    """AsyncLLM's registry of waiting requests: each has a queue its generate() reads."""

    def __init__(self, waiting: int) -> None:
        self.queues: list[list[Exception]] = [[] for _ in range(waiting)]

    def propagate_error(self, e: Exception) -> None:
        for q in self.queues:
            q.append(e)


async def test_closing_a_dead_engine_fails_the_requests_still_waiting_on_it() -> None:
    # A request registered after the output task had already failed the others.
    from vllm.v1.engine.exceptions import EngineDeadError

    engine = StandInEngine(unfinished=1)
    engine.errored = True
    engine.output_processor = processor = StandInOutputProcessor(waiting=1)
    await VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True).aclose()
    assert [type(e) for q in processor.queues for e in q] == [EngineDeadError]


async def test_closing_a_live_engine_leaves_its_requests_alone() -> None:
    engine = StandInEngine(unfinished=1)
    engine.output_processor = processor = StandInOutputProcessor(waiting=1)
    await VLLMBackend(engine, StandInTokenizer(), "m", 4096, is_cpu=True).aclose()
    assert processor.queues == [[]]
