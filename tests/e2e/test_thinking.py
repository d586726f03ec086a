"""A thinking model behind a real server: its reasoning streamed before its answer, and
force_thinking's and early_exit's traces (the session's ``thinking_backend``)."""

from __future__ import annotations

import openai
import pytest

from refinery.serving import ServerConfig
from tests.conftest import THINK_MODEL, think_model_dir

pytestmark = pytest.mark.e2e

Q = [{"role": "user", "content": "Tom has 3 apples and buys 4 more. How many apples now?"}]


@pytest.fixture(scope="module")
async def think_url(serve, thinking_backend) -> str:
    return await serve(ServerConfig(model=THINK_MODEL), backend=thinking_backend)


def aclient(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)


async def test_a_streamed_answer_sends_the_thinking_first_then_the_content(think_url):
    stream = await aclient(think_url).chat.completions.create(
        model=THINK_MODEL, messages=Q, temperature=0, max_tokens=96, stream=True)
    deltas = [c.choices[0].delta for c in [c async for c in stream] if c.choices]
    kinds = ["reasoning" if (d.model_extra or {}).get("reasoning") else
             "content" if d.content else None for d in deltas]
    kinds = [k for k in kinds if k]
    assert kinds and kinds[0] == "reasoning" and "content" in kinds
    assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning")


@pytest.mark.parametrize("spec, key", [("force_thinking(cot, min_tokens=64)", "extensions"),
                                       ("early_exit(cot, threshold=0.5)", "boundaries")])
async def test_the_trace_shows_where_the_thinking_was_extended_or_ended(think_url, spec, key):
    r = await aclient(think_url).chat.completions.create(
        model=f"{spec}@{THINK_MODEL}", messages=Q, temperature=0, max_tokens=96,
        extra_body={"refinery": {"trace": "full"}})
    [trace] = r.model_extra["refinery"]["trace"]
    meta = trace["attempt"]["metadata"]
    assert meta[key] >= 1 and meta["thinking_tokens"] > 0, meta
    assert r.choices[0].message.content and "</think>" not in r.choices[0].message.content


@pytest.fixture(scope="module")
def think_vllm_server(tmp_path_factory) -> str:
    """vLLM's own server on the thinking model with its reasoning parser (module-scoped:
    one test uses it)."""
    path = think_model_dir()
    from tests.servers import start_vllm_server

    server = start_vllm_server(
        path,
        ("--served-model-name", THINK_MODEL, "--reasoning-parser", "deepseek_r1"),
        tmp_path_factory.mktemp("think-server") / "vllm.log", kvcache_gib=1)
    try:
        server.wait_ready(300)
        yield server.url + "/v1"
    finally:
        server.terminate()


async def test_behind_vllm_s_server_the_reasoning_is_read_back(think_vllm_server):
    from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig
    from refinery.engine.types import Message, SamplingParams

    backend = OpenAIBackend(THINK_MODEL, think_vllm_server,
                            config=OpenAIConfig(upstream="vllm", reasoning_parser="deepseek_r1"))
    try:
        deltas = [d async for d in backend.stream(
            [Message(**Q[0])], SamplingParams(temperature=0.0, max_tokens=64))]
    finally:
        await backend.aclose()
    final = deltas[-1].completion
    assert final.reasoning and "".join(d.reasoning for d in deltas) == final.reasoning
    assert "<think>" not in final.reasoning + final.text
