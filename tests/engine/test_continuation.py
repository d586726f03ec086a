"""Continuing a partial assistant message (``continue_final=True``): the real
engine in process and behind vLLM's server go on from the prefix, an upstream
that cannot says so before any request, and the Context traces it."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request

from refinery.engine.backends.base import ContinuationUnsupportedError
from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
from refinery.engine.context import Context
from refinery.engine.errors import InvalidRequestError
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.types import Message, SamplingParams
from tests.engine.test_backend_openai import ok_body
from tests.scripted_backend import ScriptedBackend
from tests.servers import ThreadedApp

Q = Message(role="user", content="Write a short sentence about the sea.")
GREEDY = SamplingParams(temperature=0, max_tokens=24)


async def greedy_continues_its_own_answer(backend) -> None:
    """Greedy decoding cut at a word and continued gives the same words back:
    the continuation sees the prefix as its own turn, not as a past one."""
    [whole] = await backend.generate([Q], GREEDY)
    words = whole.text.split(" ")
    assert len(words) >= 6, whole.text
    prefix = " ".join(words[:3])
    turn = [Q, Message(role="assistant", content=prefix)]
    [rest] = await backend.generate(turn, GREEDY, continue_final=True)
    expected = whole.text[len(prefix):len(prefix) + 12]
    assert rest.text.startswith(expected), (prefix, rest.text, whole.text)
    streamed = [d async for d in backend.stream(turn, GREEDY, continue_final=True)]
    assert streamed[-1].completion.text == rest.text
    # without the flag the same messages start a new turn after the assistant's
    [fresh] = await backend.generate(turn, GREEDY)
    assert not fresh.text.startswith(expected), fresh.text


@pytest.mark.e2e
async def test_the_in_process_engine_continues_a_partial_turn(vllm_backend):
    await greedy_continues_its_own_answer(vllm_backend)


@pytest.mark.e2e
async def test_a_vllm_server_upstream_continues_a_partial_turn(vllm_server):
    backend = OpenAIBackend(DEFAULT_MODEL, vllm_server, config=OpenAIConfig(upstream="vllm"))
    try:
        await greedy_continues_its_own_answer(backend)
    finally:
        await backend.aclose()


def recording_server(bodies: list[dict]) -> ThreadedApp:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        bodies.append(await request.json())
        return ok_body(" more")

    return ThreadedApp(app)


async def test_vllm_upstream_gets_vllms_request_fields_and_others_are_refused() -> None:
    bodies: list[dict] = []
    turn = [Q, Message(role="assistant", content="The sea")]
    with recording_server(bodies) as url:
        vllm = OpenAIBackend("m", url, config=OpenAIConfig(upstream="vllm"))
        [c] = await vllm.generate(turn, GREEDY, continue_final=True)
        plain = OpenAIBackend("m", url)
        with pytest.raises(ContinuationUnsupportedError, match="vllm-server") as err:
            await plain.generate(turn, GREEDY, continue_final=True)
        with pytest.raises(InvalidRequestError, match="assistant"):
            await vllm.generate([Q], GREEDY, continue_final=True)
        await vllm.aclose()
        await plain.aclose()
    assert c.text == " more"
    assert len(bodies) == 1  # neither refusal reached the server
    assert (bodies[0]["continue_final_message"], bodies[0]["add_generation_prompt"]) == (
        True, False)
    assert err.value.code == "continuation_unsupported" and err.value.status == 400


async def test_the_context_passes_it_on_traces_it_and_does_not_retry_a_loop() -> None:
    backend = ScriptedBackend([(r".*", "and on " * 40)], watch=True)
    ctx = Context(backend, loop_detector=CusumLoopDetector(), loop_policy="retry")
    turn = [Q, Message(role="assistant", content="The sea")]
    gen = await ctx.generate(turn, GREEDY.but(max_tokens=200), continue_final=True)
    assert [c.continue_final for c in backend.calls] == [True]
    [event] = [e for e in ctx.trace.events if e.kind == "generation"]
    assert event.data == {"continue_final": True}
    assert gen[0].finish_reason == "loop" and gen[0].text.startswith("and on")
    backend.continues_messages = False
    with pytest.raises(ContinuationUnsupportedError):
        await ctx.generate(turn, GREEDY, continue_final=True)
