"""Logprobs over HTTP on the scripted backend (one token per word, with ``alt1``...
alternatives): chat's ``{"content": [...]}`` and completions' legacy lists, whole
and streamed, under a strategy, and the refusals OpenAI makes."""

from __future__ import annotations

import math

import openai
import pytest

from refinery.engine.trace import Trace
from refinery.engine.types import Attempt, TokenLogprob, TopLogprob
from refinery.serving.endpoints import MIN_LOGPROB, answer, finite, legacy_logprobs
from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    COMPLETIONS,
    MODEL,
    assert_openai_error,
    chat,
    sse_data,
)
from tests.serving.structured_util import shaped_backend

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
WORDS = ["The", " answer", " is", " 4."]


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "2+2?", **fields}


def chunks(text: str) -> list[dict]:
    events = sse_data(text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return [e for e in events[:-1] if e["choices"]]


async def test_chat_logprobs_in_openai_shape(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(logprobs=True, top_logprobs=3))
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in content] == WORDS
    first = content[0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert first["bytes"] == list(b"The")
    assert [a["token"] for a in first["top_logprobs"]] == ["The", "alt1", "alt2"]
    # The SDK reads it as its own types.
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    resp = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                     "content": "hi"}],
                                             logprobs=True, top_logprobs=2)
    assert resp.choices[0].logprobs.content[1].top_logprobs[1].token == "alt1"


async def test_chat_without_logprobs_has_none(scripted_serve, client):
    backend = ScriptedBackend([(r".*", ANSWER)])
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat())
    assert "logprobs" not in r.json()["choices"][0]
    assert not backend.calls[0].params.logprobs


async def test_chat_stream_chunks_carry_their_tokens_logprobs(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(stream=True, logprobs=True, top_logprobs=1))
    with_text = [c["choices"][0] for c in chunks(r.text) if c["choices"][0]["delta"].get(
        "content")]
    assert [c["delta"]["content"] for c in with_text] == WORDS
    for c in with_text:
        [token] = c["logprobs"]["content"]
        assert token["token"] == c["delta"]["content"] and len(token["top_logprobs"]) == 1


async def test_completion_legacy_logprobs(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + COMPLETIONS, json=completion(logprobs=2))
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == WORDS
    assert lp["text_offset"] == [0, 3, 10, 13]
    assert len(lp["token_logprobs"]) == 4
    assert lp["top_logprobs"][0] == {"The": lp["token_logprobs"][0],
                                     "alt1": lp["token_logprobs"][0] - 1}
    r0 = await client.post(url + COMPLETIONS, json=completion(logprobs=0))
    assert r0.json()["choices"][0]["logprobs"]["top_logprobs"][1] == {" answer": 0.0}


async def test_completion_stream_offsets_run_on_across_chunks(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + COMPLETIONS, json=completion(logprobs=1, stream=True))
    pieces = [c["choices"][0] for c in chunks(r.text) if c["choices"][0]["text"]]
    assert [p["logprobs"]["tokens"] for p in pieces] == [[w] for w in WORDS]
    assert [p["logprobs"]["text_offset"][0] for p in pieces] == [0, 3, 10, 13]


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (CHAT, chat(top_logprobs=2), "top_logprobs"),
    (CHAT, chat(logprobs=False, top_logprobs=2), "top_logprobs"),
    (COMPLETIONS, completion(logprobs=21), "logprobs"),
])
async def test_logprob_fields_openai_refuses(scripted_serve, client, path, body, param):
    backend = ScriptedBackend([(r".*", ANSWER)])
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + path, json=body)
    assert r.status_code == 400
    err = assert_openai_error(r.json(), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert backend.calls == []


# -- under a strategy ------------------------------------------------------------------------

async def test_under_a_strategy_the_answers_own_sample_gives_the_logprobs(scripted_serve,
                                                                         client):
    backend = ScriptedBackend([(r".*", ["\\boxed{1}", "\\boxed{2}", "\\boxed{2}"])])
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(model=f"sc(cot, n=3)@{MODEL}",
                                                logprobs=True, top_logprobs=1))
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "\\boxed{2}"
    assert "".join(t["token"] for t in choice["logprobs"]["content"]) == "\\boxed{2}"


async def test_under_a_strategy_completions_get_the_answer_samples_logprobs(scripted_serve,
                                                                           client):
    url, _ = await scripted_serve()
    r = await client.post(url + COMPLETIONS, json=completion(model=f"cot@{MODEL}",
                                                             logprobs=1))
    assert r.json()["choices"][0]["logprobs"]["tokens"] == WORDS


def test_an_answer_that_is_no_single_sample_has_null_logprobs():
    # A composed or edited answer text (no generation produced it whole).
    trace = Trace(task_id="t", attempt=Attempt(text="composed"))
    assert answer(trace, logprobs=True).logprobs is None


async def test_under_a_strategy_with_a_format_the_final_calls_logprobs(scripted_serve,
                                                                      client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(
        model=f"sc(cot, n=2)@{MODEL}", logprobs=True, top_logprobs=2,
        response_format={"type": "json_object"}, stream=True))
    content = [c["choices"][0] for c in chunks(r.text)
               if c["choices"][0]["delta"].get("content")]
    assert "".join(c["delta"]["content"] for c in content) == '{"a": 1}'
    assert all(c["logprobs"]["content"][0]["token"] == c["delta"]["content"]
               for c in content)
    *steps, final = backend.calls
    assert final.params.top_logprobs == 2 and all(c.params.top_logprobs == 0 for c in steps)


def test_minus_infinity_is_sent_as_a_finite_number():
    tokens = [TokenLogprob(token="a", logprob=-math.inf,
                           top_logprobs=[TopLogprob(token="b", logprob=-math.inf)])]
    [t] = finite(tokens)
    assert t.logprob == MIN_LOGPROB and t.top_logprobs[0].logprob == MIN_LOGPROB
    assert legacy_logprobs(tokens, 5).model_dump() == {
        "tokens": ["a"], "token_logprobs": [MIN_LOGPROB],
        "top_logprobs": [{"a": MIN_LOGPROB, "b": MIN_LOGPROB}], "text_offset": [5]}
