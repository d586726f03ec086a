"""Cached prompt tokens from the backends: vLLM's ``RequestOutput.num_cached_tokens``
(on a stand-in for AsyncLLM, no engine started) and an OpenAI-compatible
upstream's ``usage.prompt_tokens_details.cached_tokens`` (a small fake server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from refinery.engine.backends.openai import OpenAIBackend
from refinery.engine.backends.vllm import VLLMBackend
from refinery.engine.types import Message, SamplingParams
from tests.engine.test_backend_openai import ok_body
from tests.engine.test_backend_vllm_close import StandInEngine, StandInTokenizer
from tests.servers import ThreadedApp

Q = [Message(role="user", content="What is 2+2?")]


def output(text: str, tokens: int, cached: int | None, finish: str | None) -> SimpleNamespace:
    """A vLLM RequestOutput with one sample, as far as the backend reads it."""
    sample = SimpleNamespace(index=0, text=text, token_ids=[7] * tokens,
                             finish_reason=finish, cumulative_logprob=None, logprobs=None)
    return SimpleNamespace(outputs=[sample], num_cached_tokens=cached)


class EngineWithOutputs(StandInEngine):
    """Answers every request with ``outputs``, in order (the whole list per request)."""

    def __init__(self, outputs: list[SimpleNamespace]) -> None:
        super().__init__(unfinished=0)
        self.outputs = outputs

    async def generate(self, prompt, sampling_params, request_id):
        for out in self.outputs:
            yield out


def backend(outputs: list[SimpleNamespace]) -> VLLMBackend:
    return VLLMBackend(EngineWithOutputs(outputs), StandInTokenizer(), "m", 4096,
                       is_cpu=True)


async def test_vllm_generate_reports_the_cached_prompt_tokens() -> None:
    [c] = await backend([output("4", 2, 16, "stop")]).generate(Q, SamplingParams())
    assert (c.text, c.completion_tokens, c.cached_tokens) == ("4", 2, 16)


async def test_vllm_stream_keeps_the_count_reported_after_prefill() -> None:
    outs = [output("The", 1, None, None), output(" answer", 1, 16, None),
            output(" is 4", 2, None, "stop")]
    deltas = [d async for d in backend(outs).stream(Q, SamplingParams())]
    comp = deltas[-1].completion
    assert comp is not None and comp.text == "The answer is 4"
    assert (comp.completion_tokens, comp.cached_tokens) == (4, 16)


async def test_vllm_output_without_the_field_is_unknown_not_zero() -> None:
    out = output("4", 1, None, "stop")
    del out.num_cached_tokens  # an engine version without it
    [c] = await backend([out]).generate(Q, SamplingParams())
    assert c.cached_tokens is None


def upstream(details: dict | None) -> FastAPI:
    """An OpenAI-compatible server whose usage carries ``prompt_tokens_details``."""
    app = FastAPI()
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
             **({"prompt_tokens_details": details} if details is not None else {})}

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        if not body.get("stream"):
            return {**ok_body(), "usage": usage}

        async def events():
            head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
            piece = {"index": 0, "delta": {"content": "4"}, "finish_reason": "stop"}
            yield f"data: {json.dumps({**head, 'choices': [piece]})}\n\n"
            yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


async def test_openai_upstream_cached_tokens_whole_and_streamed() -> None:
    with ThreadedApp(upstream({"cached_tokens": 3})) as url:
        be = OpenAIBackend("m", url)
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
        streamed = [d async for d in be.stream(Q, SamplingParams(max_tokens=4))]
        await be.aclose()
    assert (c.prompt_tokens, c.cached_tokens) == (5, 3)
    assert streamed[-1].completion.cached_tokens == 3


async def test_openai_upstream_without_details_is_unknown() -> None:
    for details in (None, {"cached_tokens": None}):
        with ThreadedApp(upstream(details)) as url:
            be = OpenAIBackend("m", url)
            [c] = await be.generate(Q, SamplingParams(max_tokens=4))
            await be.aclose()
        assert c.cached_tokens is None
