"""The OpenAI-compatible server: real uvicorn, real model, the official SDK."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from refinery.engine.types import Message
from refinery.serving import ServerConfig
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
Q = [{"role": "user", "content": "What is 2+2? Answer briefly."}]


def client(url: str, key: str = "none", **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **kw)


async def http(method: str, url: str, **kw) -> httpx.Response:
    # The server shares this event loop: a blocking client would deadlock it.
    async with httpx.AsyncClient(timeout=60) as h:
        return await h.request(method, url, **kw)


async def engine_idle(backend, seconds: float = 10.0) -> bool:
    return await wait_for(lambda: backend.num_unfinished_requests() == 0, seconds)


def aclient(url: str, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


async def test_plain_chat_sync_and_async_clients(server_url):
    r = await asyncio.to_thread(client(server_url).chat.completions.create, model=MODEL,
                                messages=Q, temperature=0, max_tokens=24)
    assert r.object == "chat.completion" and r.model == MODEL
    assert "4" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    ra = await aclient(server_url).chat.completions.create(model=MODEL, messages=Q,
                                                           temperature=0, max_tokens=24)
    assert ra.choices[0].message.content == r.choices[0].message.content


async def test_multi_turn_structure_reaches_the_model(server_url, vllm_backend):
    msgs = [{"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "Say hello."},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Now say thank you."}]
    r = await aclient(server_url).chat.completions.create(model=MODEL, messages=msgs,
                                                          temperature=0, max_tokens=16)
    # The prompt the model saw is the four turns through the chat template,
    # not a flattened single user message.
    turns = [Message(**m) for m in msgs]
    flat = [Message(role="user", content="\n".join(m["content"] for m in msgs))]
    assert r.usage.prompt_tokens == vllm_backend.count_tokens(turns)
    assert r.usage.prompt_tokens != vllm_backend.count_tokens(flat)


async def test_strategy_chat_reports_all_calls(server_url):
    r = await aclient(server_url).chat.completions.create(
        model=f"sc(cot, n=3)@{MODEL}", messages=Q, max_tokens=48)
    ext = r.model_extra["refinery"]
    assert ext["strategy"].startswith("sc(")
    assert ext["calls"] >= 1
    assert r.usage.completion_tokens > 0 and r.choices[0].message.content
    # extra_body carries the spec too, and can ask for a trace summary.
    r2 = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=Q, max_tokens=48,
        extra_body={"refinery": {"strategy": "critique_refine(rounds=1)",
                                 "trace": "summary"}})
    ext2 = r2.model_extra["refinery"]
    assert ext2["calls"] >= 2  # draft + critique at least
    assert ext2["trace"][0]["events"] >= 2


async def test_n2_gives_two_choices(server_url):
    r = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=Q, n=2, temperature=1.0, max_tokens=16)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content for c in r.choices)


async def test_streaming_role_first_tokens_and_usage(server_url):
    stream = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=Q, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1
    content = [c.choices[0].delta.content for c in chunks if c.choices
               and c.choices[0].delta.content]
    assert len(content) > 3  # streamed as generated, not one blob
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    whole = await aclient(server_url).chat.completions.create(
        model=MODEL, messages=Q, temperature=0, max_tokens=24)
    assert "".join(content) == whole.choices[0].message.content


async def test_strategy_stream_shows_reasoning_then_answer(server_url):
    stream = await aclient(server_url).chat.completions.create(
        model=f"sage(cot)@{MODEL}", messages=Q, max_tokens=48, stream=True)
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = [c.choices[0].delta.model_extra.get("reasoning_content") for c in chunks
                 if c.choices and c.choices[0].delta.model_extra.get("reasoning_content")]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning and "sage" in "".join(reasoning)
    assert content.strip()
    assert chunks[-1].choices[0].finish_reason is not None


async def test_completions_endpoint(server_url):
    c = client(server_url)
    r = await asyncio.to_thread(c.completions.create, model=MODEL, prompt="2+2=",
                                max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    chunks = await asyncio.to_thread(lambda: list(c.completions.create(
        model=MODEL, prompt="Count: 1, 2, 3,", max_tokens=12, temperature=0, stream=True)))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text and chunks[-1].choices[0].finish_reason is not None


async def test_errors_map_to_sdk_exceptions(server_url, serve):
    c = aclient(server_url)
    with pytest.raises(openai.BadRequestError, match="did you mean"):
        await c.chat.completions.create(model=f"ssrr@{MODEL}", messages=Q)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        await c.chat.completions.create(model=MODEL, messages=Q, temperature=7)
    with pytest.raises(openai.NotFoundError, match=MODEL):
        await c.chat.completions.create(model="gpt-9", messages=Q)
    with pytest.raises(openai.BadRequestError, match="context window"):
        await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi " * 6000}])
    with pytest.raises(openai.BadRequestError, match="budget"):
        await c.chat.completions.create(model=f"ssr@{MODEL}", messages=Q, extra_body={
            "refinery": {"budget": {"max_calls": 10**9}}})
    with pytest.raises(openai.BadRequestError, match="worst-case|calls"):
        await c.chat.completions.create(model=f"sc(sc(sc(cot, n=64), n=64), n=64)@{MODEL}",
                                        messages=Q)
    # Error bodies are in the OpenAI schema.
    r = await http("POST", server_url + "/v1/chat/completions", json={"model": "x"})
    err = r.json()["error"]
    assert r.status_code == 400 and set(err) == {"message", "type", "param", "code"}
    # 413: body over the limit; 503: engine not ready.
    small = await serve(ServerConfig(max_body_bytes=1000))
    r = await http("POST", small + "/v1/chat/completions", json={"model": MODEL, "messages": [
        {"role": "user", "content": "x" * 5000}]})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]

    async def never_ready():
        await asyncio.sleep(3600)

    starting = await serve(backend_factory=never_ready)
    assert (await http("GET", starting + "/health")).status_code == 503
    with pytest.raises(openai.InternalServerError) as exc:
        await aclient(starting).chat.completions.create(model=MODEL, messages=Q)
    assert exc.value.status_code == 503


async def test_over_capacity_is_429(serve, vllm_backend):
    url = await serve(ServerConfig(max_concurrent_requests=1))
    c = aclient(url)
    long = asyncio.ensure_future(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to 500."}],
        max_tokens=400, temperature=0))
    assert await wait_for(vllm_backend.num_unfinished_requests, seconds=10)
    with pytest.raises(openai.RateLimitError, match="capacity"):
        await c.chat.completions.create(model=MODEL, messages=Q, max_tokens=4)
    # A non-streaming client that goes away also aborts its engine request.
    long.cancel()
    assert await engine_idle(vllm_backend)


async def test_auth_on_and_off(serve, server_url):
    url = await serve(ServerConfig(api_keys=frozenset({"k-right", "k-other"})))
    with pytest.raises(openai.AuthenticationError):
        await aclient(url, "k-wrong").chat.completions.create(model=MODEL, messages=Q)
    r = await http("GET", url + "/v1/models")  # no Authorization header at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = await aclient(url, "k-right").chat.completions.create(model=MODEL, messages=Q,
                                                              max_tokens=4)
    assert r.choices[0].message.content is not None
    assert (await http("GET", url + "/health")).status_code == 200  # health stays open
    models = await aclient(server_url, "anything").models.list()  # auth off: any key
    ids = [m.id for m in models.data]
    assert MODEL in ids and f"ssr@{MODEL}" in ids


async def test_disconnect_mid_stream_aborts_backend_request(server_url, vllm_backend):
    body = {"model": MODEL, "stream": True, "max_tokens": 1500, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from 1 to 2000."}]}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", server_url + "/v1/chat/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                if line.startswith("data: ") and "content" in line:
                    seen += 1
                if seen >= 5:
                    break
            assert vllm_backend.num_unfinished_requests() == 1
    assert await engine_idle(vllm_backend)


async def test_32_concurrent_clients_all_answered(server_url):
    c = aclient(server_url)
    rs = await asyncio.gather(*(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Say the number {i}."}],
        max_tokens=12) for i in range(32)))
    assert len(rs) == 32 and all(r.choices[0].message.content for r in rs)
    assert len({r.id for r in rs}) == 32


async def test_health_and_metrics(server_url):
    assert (await http("GET", server_url + "/health")).status_code == 200
    text = (await http("GET", server_url + "/metrics")).text
    assert "refinery_requests_total" in text and "refinery_tokens_total" in text
    line = next(ln for ln in text.splitlines()
                if ln.startswith("refinery_requests_total") and 'status="200"' in ln)
    assert float(line.split()[-1]) >= 1
