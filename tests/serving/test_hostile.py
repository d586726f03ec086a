"""Hand-written hostile requests against a real uvicorn server over the real engine.

Huge and endless bodies, deeply nested JSON, ten thousand messages, unicode
edge cases, NaN and Infinity, strategy specs built to explode: each must be
answered with a 4xx in the OpenAI error schema (or a 200 where the input is
merely odd), never a 500, the server must stay healthy, and a refused spec
must not have reached the model at all (a counting delegate over the real
backend proves zero model calls). Errors that tests/e2e/test_server.py
already maps to SDK exceptions are not repeated; the cases here are the
streaming and /v1/completions variants it leaves out.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from refinery.serving import ServerConfig
from tests.serving.conftest import CountingBackend, assert_openai_error
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
Q = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
CHAT = "/v1/chat/completions"


def aclient(url: str, key: str = "none") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


async def post_raw(url: str, content: bytes, *, path: str = CHAT,
                   headers: dict[str, str] | None = None) -> httpx.Response:
    # Async client: the server shares this event loop, a blocking one would deadlock.
    async with httpx.AsyncClient(timeout=300) as h:
        return await h.post(url + path, content=content,
                            headers={"content-type": "application/json", **(headers or {})})


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": Q, "max_tokens": 4, "temperature": 0, **fields}


async def still_serving(url: str) -> None:
    """/health is 200 and a real request still gets a real answer."""
    async with httpx.AsyncClient(timeout=300) as h:
        assert (await h.get(url + "/health")).status_code == 200
        r = await h.post(url + CHAT, json=chat_body())
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


@pytest.fixture(scope="module")
async def counted(serve, counting_backend) -> tuple[str, CountingBackend]:
    """A server with default limits over the counting delegate of the real engine."""
    return await serve(ServerConfig(), backend=counting_backend), counting_backend


# -- size ---------------------------------------------------------------------------------

async def test_20mb_body_is_413_declared_or_streamed(counted):
    url, backend = counted
    calls = backend.calls
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * 20_000_000}]))
    r = await post_raw(url, big.encode())
    assert r.status_code == 413
    assert "limit" in assert_openai_error(r.json())["message"]

    async def chunked():
        # No Content-Length: the limit must hold on the bytes actually received.
        data = big.encode()
        for i in range(0, len(data), 1 << 20):
            yield data[i:i + (1 << 20)]

    async with httpx.AsyncClient(timeout=300) as h:
        r = await h.post(url + CHAT, content=chunked(),
                         headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text[:300]
    assert "limit" in assert_openai_error(r.json())["message"]
    assert backend.calls == calls
    await still_serving(url)


async def test_413_through_the_sdk(counted):
    url, _ = counted
    with pytest.raises(openai.APIStatusError) as exc:
        await aclient(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "y" * 5_000_000}])
    assert exc.value.status_code == 413


async def test_deeply_nested_json_is_400_not_a_crash(counted):
    url, backend = counted
    calls = backend.calls
    depth = 100_000
    head = '{"model": "' + MODEL + '", "messages": ' + json.dumps(Q)
    lists = head + ', "stop": ' + "[" * depth + "]" * depth + "}"
    objects = head + ', "x": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    # Shallow enough for the JSON parser, so the depth reaches pydantic instead.
    content = ('{"model": "' + MODEL + '", "messages": [{"role": "user", "content": '
               + "[" * 500 + '"x"' + "]" * 500 + "}]}")
    for body in (lists, objects, content):
        r = await post_raw(url, body.encode())
        assert r.status_code == 400, r.text[:300]
        assert_openai_error(r.json())
    assert backend.calls == calls
    await still_serving(url)


async def test_ten_thousand_messages_refused_with_the_limit(counted):
    url, backend = counted
    calls = backend.calls
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
            for i in range(10_000)]
    with pytest.raises(openai.BadRequestError) as exc:
        await aclient(url).chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
    err = exc.value.body
    assert "10000 messages" in err["message"] and "2048" in err["message"]
    assert err["param"] == "messages"
    assert backend.calls == calls


# -- unicode and odd values ----------------------------------------------------------------

UNICODE_CONTENT = {
    "nul": "before\u0000after",
    "rtl marks": "\u202eevil\u202c \u200f\u05e9\u05dc\u05d5\u05dd\u200e",
    "combining": "e" + "\u0301" * 500,
    "4-byte emoji": "\U0001f600\U0001f9d1\u200d\U0001f680" * 50,
    "bom and zero width": "\ufeff\u200b\u2060x",
    "noncharacters": "\ufffe\uffff\U0010ffff",
}


@pytest.mark.parametrize("name", list(UNICODE_CONTENT))
async def test_unicode_edge_cases_are_answered(counted, name):
    url, _ = counted
    text = UNICODE_CONTENT[name]
    r = await post_raw(url, json.dumps(chat_body(messages=[
        {"role": "user", "content": text}], stop=[text[:3]])).encode())
    assert r.status_code == 200, r.text[:300]
    assert r.json()["choices"][0]["message"]["content"] is not None


def raw_chat(rest: str, model: str = MODEL) -> str:
    """A chat body as JSON text, so escapes like ``\\ud800`` reach the server as sent."""
    return '{"model": "' + model + '", "max_tokens": 4, ' + rest + "}"


HI = r'"messages": [{"role": "user", "content": "hi"}]'
# Valid JSON, but a lone surrogate escape decodes to text UTF-8 cannot encode.
RAW_BODIES = {
    "lone high surrogate in content": raw_chat(
        r'"messages": [{"role": "user", "content": "a\ud800b"}]'),
    "lone low surrogate in content": raw_chat(
        r'"messages": [{"role": "user", "content": "\udfff"}]'),
    "surrogate in content part": raw_chat(
        r'"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]'),
    "surrogate in name": raw_chat(
        r'"messages": [{"role": "user", "content": "hi", "name": "\ud800"}]'),
    "surrogate in stop": raw_chat(HI + r', "stop": ["\ud83d"]'),
    "surrogate in model": raw_chat(HI, model=r"\ud800"),
    "surrogate in spec": raw_chat(HI, model=r"cot\ud800@" + MODEL),
    "surrogate in extra_body spec": raw_chat(HI + r', "refinery": {"strategy": "\udfff"}'),
    "surrogate in completion prompt": raw_chat(r'"prompt": "\ud800"'),
}


@pytest.mark.parametrize("name", list(RAW_BODIES))
async def test_lone_surrogates_are_400_naming_the_problem(counted, name):
    url, backend = counted
    calls = backend.calls
    path = "/v1/completions" if "prompt" in name else CHAT
    r = await post_raw(url, RAW_BODIES[name].encode(), path=path)
    assert r.status_code == 400, r.text[:300]
    assert "surrogate" in assert_openai_error(r.json())["message"]
    assert backend.calls == calls


@pytest.mark.parametrize("raw", [
    b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "\xff\xfe\xc0\xaf"}]}',
    b'\xef\xbb\xbf{"model": "smollm2-135m", "messages": []}',
    b'\x00\x00\x00{',
    b'{"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}',
    b'',
    b'[]',
    b'"just a string"',
], ids=["invalid utf-8", "utf-8 bom", "nul bytes", "truncated", "empty", "array", "string"])
async def test_bad_bytes_are_400(counted, raw):
    url, backend = counted
    calls = backend.calls
    r = await post_raw(url, raw)
    assert r.status_code == 400, r.text[:300]
    assert_openai_error(r.json())
    assert backend.calls == calls


async def test_empty_stop_string_is_400_not_500(counted):
    # Found by the fuzzer: vLLM refuses stop=[""] while building its sampling params,
    # outside the request's error mapping, which made it a 500.
    url, _ = counted
    for stop in ([""], ["x", ""], ""):
        r = await post_raw(url, json.dumps(chat_body(stop=stop)).encode())
        assert r.status_code == 400, r.text[:300]
        assert "empty string" in assert_openai_error(r.json())["message"]
        r = await post_raw(url, json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4,
                                            "stop": stop}).encode(), path="/v1/completions")
        assert r.status_code == 400, r.text[:300]


@pytest.mark.parametrize("fields", [
    '"temperature": NaN', '"temperature": Infinity', '"top_p": NaN',
    '"max_tokens": 1e400', '"n": 1e400', '"frequency_penalty": NaN',
    '"refinery": {"budget": {"max_seconds": NaN}}',
    '"refinery": {"budget": {"max_seconds": Infinity}}',
    '"max_tokens": 100000000000000000000000000000000000000',
    '"max_completion_tokens": 100000000000000000000000000000000000000',
    '"seed": -100000000000000000000000000000000000000',
])
async def test_non_finite_and_huge_numbers_are_never_500(counted, fields):
    url, _ = counted
    # The budget keeps a huge max_tokens cheap; a later duplicate key wins in JSON.
    raw = raw_chat(HI + ', "refinery": {"budget": {"max_tokens": 8}}, ' + fields)
    r = await post_raw(url, raw.encode())
    assert r.status_code in (200, 400), r.text[:300]
    if r.status_code == 400:
        assert_openai_error(r.json())
    else:  # the answer itself must be strict JSON (no NaN echoed back)
        json.loads(r.text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


# -- strategy specs built to explode ------------------------------------------------------

EXPLODING_SPECS = {
    "nesting 200 deep": ("sc(" * 200 + "cot" + ")" * 200, "nests deeper than 5 levels"),
    "n in the thousands": ("sc(cot, n=5000)", "less than or equal to 64"),
    "votes in the thousands": ("dei(dei(ssr, ssr, ssr), ssr, sage(ssr), votes=1000)",
                               "votes"),
    "calls multiply": ("sc(sc(sc(ssr, n=64), n=64), n=64)", "model calls"),
    "members x rounds": ("dei(" + ", ".join(["sage(ssr, rounds=4)"] * 4) + ", votes=32)",
                         "2004 model calls"),
    "too many members": ("dei(dei(" + ", ".join(["ssr"] * 8) + "), dei("
                         + ", ".join(["ssr"] * 8) + "), dei(" + ", ".join(["ssr"] * 8)
                         + "), dei(" + ", ".join(["ssr"] * 8) + "))",
                         "more than 64 strategies"),
    "fan-out of 500": ("dei(" + ", ".join(["cot"] * 500) + ")", "longer than 2000"),
    "wide fan-out": ("dei(" + ", ".join(["cot"] * 40) + ")", "fan-out limit"),
    "very long spec": ("sc(cot, n=2" + ", temperature=0.5" * 6000 + ")", "longer than 2000"),
    "preset padded to 100 kB": ("cot" + " " * 100_000, "longer than 2000"),
    "attribute access": ("cot.__class__.__mro__", "attribute access"),
    "lambda": ("lambda: __import__('os').system('true')", "lambda"),
    "dunder name": ("__import__(os)", "names starting with '_'"),
    "dunder call": ("__builtins__", "names starting with '_'"),
    "huge integer literal": ("sc(cot, n=" + "9" * 1900 + ")", "less than or equal to 64"),
    "deep unary minus": ("sc(cot, n=" + "-" * 1900 + "1)", "unary operators"),
    "deep arithmetic": ("sc(cot, n=" + "1+" * 900 + "1)", "arithmetic"),
    "repeated parameter": ("sc(cot, n=2, n=64)", "more than once"),
    "subscript": ("sc[0]", "subscripting"),
    "comprehension": ("[cot for cot in cot]", "comprehensions"),
    "nul byte": ("cot\x00", "null bytes"),
    "unknown name": ("rm_rf(cot)", "unknown strategy"),
}


@pytest.mark.parametrize("name", list(EXPLODING_SPECS))
async def test_exploding_specs_refused_before_any_model_call(counted, name):
    url, backend = counted
    spec, reason = EXPLODING_SPECS[name]
    calls = backend.calls
    c = aclient(url)
    # The spec in the model field and in extra_body: both refused, for the same reason.
    with pytest.raises(openai.BadRequestError) as in_model:
        await c.chat.completions.create(model=f"{spec}@{MODEL}", messages=Q, max_tokens=4)
    with pytest.raises(openai.BadRequestError) as in_body:
        await c.chat.completions.create(model=MODEL, messages=Q, max_tokens=4,
                                        extra_body={"refinery": {"strategy": spec}})
    for exc in (in_model, in_body):
        err = exc.value.body
        assert reason in err["message"], err
        assert err["type"] == "invalid_request_error" and err["param"]
        assert len(err["message"]) < 4000  # the reason, not an echo of the input
    assert backend.calls == calls


async def test_exploding_spec_refused_on_streams_and_completions(counted):
    url, backend = counted
    calls = backend.calls
    spec = "sc(sc(sc(ssr, n=64), n=64), n=64)"
    c = aclient(url)
    with pytest.raises(openai.BadRequestError, match="model calls"):
        await c.chat.completions.create(model=f"{spec}@{MODEL}", messages=Q, stream=True)
    with pytest.raises(openai.BadRequestError, match="model calls"):
        await c.completions.create(model=f"{spec}@{MODEL}", prompt="2+2=", stream=True)
    with pytest.raises(openai.BadRequestError, match="nests deeper"):
        await c.completions.create(model=MODEL, prompt="2+2=", extra_body={
            "refinery": {"strategy": "sc(" * 50 + "cot" + ")" * 50}})
    assert backend.calls == calls


# -- status codes through the SDK (the variants test_server.py leaves out) ---------------

async def test_unknown_model_404_on_streams_and_completions(counted):
    url, backend = counted
    c = aclient(url)
    with pytest.raises(openai.NotFoundError, match=MODEL):
        await c.chat.completions.create(model="gpt-9", messages=Q, stream=True)
    with pytest.raises(openai.NotFoundError) as exc:
        await c.completions.create(model="ssr@gpt-9", prompt="hi")
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"


async def test_bad_key_401_on_completions_and_streams(serve):
    url = await serve(ServerConfig(api_keys=frozenset({"k-right"})))
    for key in ("k-righ",):  # each wrong key counts: the 6th from one client is a 429
        c = aclient(url, key)
        with pytest.raises(openai.AuthenticationError):
            await c.completions.create(model=MODEL, prompt="hi", max_tokens=4)
        with pytest.raises(openai.AuthenticationError) as exc:
            await c.chat.completions.create(model=MODEL, messages=Q, stream=True)
        assert exc.value.body["type"] == "authentication_error"
    async with httpx.AsyncClient(timeout=60) as h:
        for header in (b"Basic x", b"Bearer k-right\xe9", b"Bearer  k-right", b"Bearer"):
            # Raw bytes: a non-ASCII header arrives as latin-1 text, never a crash.
            r = await h.post(url + CHAT, json=chat_body(), headers={"authorization": header})
            assert r.status_code == 401, (header, r.text)
            assert assert_openai_error(r.json())["code"] == "invalid_api_key"


async def test_over_capacity_429_while_a_stream_holds_the_slot(serve):
    url = await serve(ServerConfig(max_concurrent_requests=1))
    c = aclient(url)
    stream = await c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to 300."}],
        max_tokens=300, temperature=0, stream=True)
    first = await stream.__anext__()  # the slot is now taken by a live stream
    assert first.choices[0].delta.role == "assistant"
    with pytest.raises(openai.RateLimitError, match="capacity"):
        await c.chat.completions.create(model=MODEL, messages=Q, max_tokens=4, stream=True)
    with pytest.raises(openai.RateLimitError) as exc:
        await c.completions.create(model=MODEL, prompt="hi", max_tokens=4)
    assert exc.value.body["type"] == "rate_limit_error"
    await stream.close()
    # The slot frees once the server sees the client gone (the gauge reads 0).
    async with httpx.AsyncClient(timeout=60) as h:
        async def freed() -> bool:
            return "refinery_requests_in_flight 0.0" in (await h.get(url + "/metrics")).text

        assert await wait_for(freed, seconds=30, every=0.1)
    r = await c.chat.completions.create(model=MODEL, messages=Q, max_tokens=4)
    assert r.choices[0].message.content is not None


async def test_unknown_routes_and_methods_use_the_error_schema(counted):
    url, _ = counted
    async with httpx.AsyncClient(timeout=60) as h:
        r = await h.get(url + CHAT)
        assert r.status_code == 405 and assert_openai_error(r.json())
        r = await h.post(url + "/v1/nothing", json={})
        assert r.status_code == 404
        assert assert_openai_error(r.json())["type"] == "not_found_error"
        r = await h.post(url + CHAT, content=b"model=x", headers={
            "content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415
        assert assert_openai_error(r.json())["code"] == "unsupported_media_type"


async def test_free_form_specs_do_not_multiply_metric_series(counted):
    url, _ = counted
    c = aclient(url)
    for i in range(2):
        spec = f"cot(instruction='Be brief, variant {i}.')"
        r = await c.chat.completions.create(model=MODEL, messages=Q, max_tokens=4,
                                            extra_body={"refinery": {"strategy": spec}})
        assert r.model_extra["refinery"]["strategy"] == spec
    async with httpx.AsyncClient(timeout=60) as h:
        text = (await h.get(url + "/metrics")).text
    # One series per root strategy, whatever the parameters: a client cannot grow
    # the metric registry without bound by varying a string parameter.
    assert 'strategy="cot"' in text and "variant" not in text
