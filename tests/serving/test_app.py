"""The HTTP layer over a scripted backend: auth, capacity, every error status in
the OpenAI error schema, usage totals, n choices on one budget, health, metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from refinery.engine.errors import RequestTooLargeError
from refinery.serving import ServerConfig
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    COMPLETIONS,
    MODEL,
    assert_openai_error,
    chat,
    scripted,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
KEYS = frozenset({"k-right", "k-other"})


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return assert_openai_error(response.json(), status)


# -- auth ------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, bearer("k-wrong"), {"Authorization": "k-right"}])
async def test_auth_refuses_a_missing_or_wrong_key_on_every_api_route(scripted_serve, client,
                                                                      headers):
    url, _ = await scripted_serve(ServerConfig(api_keys=KEYS))
    for method, path, body in [("POST", CHAT, chat()), ("GET", "/v1/models", None),
                               ("POST", COMPLETIONS, {"model": MODEL, "prompt": "hi"})]:
        r = await client.request(method, url + path, json=body, headers=headers)
        err = await error_of(r, 401)
        assert err == {"message": "invalid or missing API key",
                       "type": "authentication_error", "param": None,
                       "code": "invalid_api_key"}


async def test_auth_lets_any_configured_key_through_and_health_stays_open(scripted_serve,
                                                                          client):
    url, _ = await scripted_serve(ServerConfig(api_keys=KEYS))
    for key in KEYS:
        r = await client.post(url + CHAT, json=chat(), headers=bearer(key))
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == ANSWER
    assert (await client.get(url + "/health")).status_code == 200
    assert (await client.get(url + "/metrics")).status_code == 200


async def test_without_keys_any_key_or_none_is_accepted(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.get(url + "/v1/models", headers=bearer("anything"))
    ids = [card["id"] for card in r.json()["data"]]
    assert r.status_code == 200 and ids[0] == MODEL and f"ssr@{MODEL}" in ids
    assert (await client.get(url + "/v1/models")).status_code == 200


# -- capacity --------------------------------------------------------------------------

async def test_over_capacity_is_429_in_the_openai_shape(scripted_serve, client):
    backend = scripted(hang_after=0)  # the first call waits until cancelled
    url, app = await scripted_serve(ServerConfig(max_concurrent_requests=1), backend=backend)
    first = asyncio.ensure_future(client.post(url + CHAT, json=chat()))
    assert await wait_for(lambda: backend.in_flight == 1)
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "hi"})
    err = await error_of(r, 429)
    assert err["type"] == "rate_limit_error" and "capacity" in err["message"]
    assert app.state.server.capacity.in_flight == 1
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert await wait_for(lambda: app.state.server.capacity.in_flight == 0)
    assert backend.cancelled == [0]  # the client left: its backend call was aborted
    backend.hang_after = None
    r = await client.post(url + CHAT, json=chat())
    assert r.status_code == 200  # the slot is free again


async def test_a_stream_holds_its_slot_until_it_ends(scripted_serve, client):
    backend = scripted(hang_after=0)
    url, app = await scripted_serve(ServerConfig(max_concurrent_requests=1), backend=backend)
    async with httpx.AsyncClient(timeout=20) as other:  # its own connection pool
        async with other.stream("POST", url + CHAT, json=chat(stream=True)) as stream:
            lines = stream.aiter_lines()
            assert '"role":"assistant"' in await anext(lines)
            r = await client.post(url + CHAT, json=chat(stream=True))
            assert (await error_of(r, 429))["type"] == "rate_limit_error"
            await lines.aclose()  # not left to the garbage collector mid-test
    assert await wait_for(lambda: app.state.server.capacity.in_flight == 0)
    metrics = (await client.get(url + "/metrics")).text
    assert "refinery_requests_in_flight 0.0" in metrics


# -- every error status ----------------------------------------------------------------

@pytest.mark.parametrize(("body", "param", "says"), [
    (chat(model=f"ssrr@{MODEL}"), None, "did you mean"),
    (chat(model=f"sc(cot, n=0)@{MODEL}"), None, "n"),
    (chat(temperature=7), "temperature", "less than or equal to 2"),
    (chat(n=0), "n", "greater than or equal to 1"),
    ({"model": MODEL}, "messages", "Field required"),
    (chat(messages=[{"role": "user", "content": "hi " * 5000}]), "messages", "context window"),
    (chat(refinery={"budget": {"max_calls": 10**9}}), "refinery.budget.max_calls",
     "above this server's limit"),
    ({"model": MODEL, "prompt": ["a", "b"]}, "prompt", "one prompt"),
])
async def test_bad_requests_are_400_naming_the_problem(scripted_serve, client, body, param,
                                                       says):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    path = COMPLETIONS if "prompt" in body else CHAT
    err = await error_of(await client.post(url + path, json=body), 400)
    assert err["type"] == "invalid_request_error" and says in err["message"]
    if param is not None:
        assert err["param"] == param
    assert backend.calls == []  # refused before any model call


async def test_prompt_too_long_has_its_code(scripted_serve, client):
    url, _ = await scripted_serve()
    body = chat(messages=[{"role": "user", "content": "hi " * 5000}])
    err = await error_of(await client.post(url + CHAT, json=body), 400)
    assert err["code"] == "context_length_exceeded"


async def test_a_budget_spent_before_any_answer_is_400(scripted_serve, client):
    url, _ = await scripted_serve()
    body = chat(refinery={"budget": {"max_tokens": 3}})
    err = await error_of(await client.post(url + CHAT, json=body), 400)
    assert err["type"] == "budget_exhausted" and err["param"] == "refinery.budget"
    assert err["message"].startswith("budget exhausted before any answer: token budget of 3")


async def test_unknown_model_is_404_listing_what_is_served(scripted_serve, client):
    url, _ = await scripted_serve()
    for path, body in [(CHAT, chat(model="gpt-9")),
                       (COMPLETIONS, {"model": "ssr@gpt-9", "prompt": "hi"})]:
        err = await error_of(await client.post(url + path, json=body), 404)
        assert err["type"] == "not_found_error" and err["code"] == "model_not_found"
        assert err["param"] == "model" and f"ssr@{MODEL}" in err["message"]
    err = await error_of(await client.get(url + "/v1/nothing"), 404)
    assert err == {"message": "Not Found", "type": "not_found_error", "param": None,
                   "code": None}
    err = await error_of(await client.get(url + CHAT), 405)
    assert err["type"] == "invalid_request_error"


async def test_body_over_the_limit_is_413_declared_or_chunked(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(ServerConfig(max_body_bytes=1000), backend=backend)
    big = chat(messages=[{"role": "user", "content": "x" * 5000}])
    err = await error_of(await client.post(url + CHAT, json=big), 413)
    assert err["type"] == RequestTooLargeError.type
    assert "over the limit of 1000" in err["message"]

    async def chunked():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b" " * 500

    r = await client.post(url + CHAT, content=chunked(),
                          headers={"content-type": "application/json"})
    assert "over the limit of 1000" in (await error_of(r, 413))["message"]
    assert backend.calls == []


async def test_engine_not_ready_is_503_on_health_and_requests(scripted_serve, client):
    async def never_ready():
        await asyncio.sleep(3600)

    url, _ = await scripted_serve(backend_factory=never_ready)
    err = await error_of(await client.get(url + "/health"), 503)
    assert err == {"message": "not ready: starting", "type": "service_unavailable",
                   "param": None, "code": None}
    err = await error_of(await client.post(url + CHAT, json=chat()), 503)
    assert "not ready (still starting)" in err["message"]


async def test_engine_that_failed_to_start_says_why(scripted_serve, client):
    async def fails():
        raise RuntimeError("out of memory for the KV cache")

    url, _ = await scripted_serve(backend_factory=fails)
    assert await wait_for(lambda: True)
    r = await client.get(url + "/health")
    assert (await error_of(r, 503))["message"] == "not ready: out of memory for the KV cache"
    err = await error_of(await client.post(url + CHAT, json=chat()), 503)
    assert err["message"].endswith(": out of memory for the KV cache")


async def test_dead_engine_is_503(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    assert (await client.get(url + "/health")).status_code == 200
    backend.die()
    err = await error_of(await client.get(url + "/health"), 503)
    assert err["message"] == "not ready: engine died"
    err = await error_of(await client.post(url + CHAT, json=chat()), 503)
    assert err["type"] == "service_unavailable" and "died" in err["message"]


# -- usage and n -----------------------------------------------------------------------

async def test_usage_totals_and_refinery_extension(scripted_serve, client):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(refinery={"trace": "summary"}))
    body = r.json()
    # Scripted counts: the prompt is its words + 4, the answer is 4 words.
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9,
                             "completion_tokens_details": {"reasoning_tokens": 0}}
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["refinery"]["calls"] == 1 and body["refinery"]["trace"][0]["events"] == 1
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?"})
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": ANSWER, "finish_reason": "stop"}]
    assert body["usage"]["total_tokens"] == 9


async def test_n_choices_share_one_budget(scripted_serve, client):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(n=2, refinery={"budget": {"max_calls": 2}}))
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18,
                             "completion_tokens_details": {"reasoning_tokens": 0}}
    assert body["refinery"]["calls"] == 2 and len(backend.calls) == 2
    # One call each would fit a budget of 1 alone; two choices on one budget do not.
    r = await client.post(url + CHAT, json=chat(n=2, refinery={"budget": {"max_calls": 1}}))
    err = await error_of(r, 400)
    assert err["type"] == "budget_exhausted" and "call budget of 1" in err["message"]
    assert len(backend.calls) == 3


# -- metrics ---------------------------------------------------------------------------

async def test_metrics_count_requests_by_outcome_and_root_strategy(scripted_serve, client):
    url, _ = await scripted_serve()
    await client.post(url + CHAT, json=chat())
    await client.post(url + CHAT, json=chat(model=f"cot(instruction='x')@{MODEL}"))
    await client.post(url + CHAT, json=chat(refinery={"budget": {"max_tokens": 3}}))
    text = (await client.get(url + "/metrics")).text
    lines = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
             if ln.startswith("refinery_")}
    labels = f'model="{MODEL}"'
    assert lines[f'refinery_requests_total{{endpoint="chat",{labels},status="200",'
                 'strategy="passthrough"}'] == 1
    assert lines[f'refinery_requests_total{{endpoint="chat",{labels},status="200",'
                 'strategy="cot"}'] == 1
    assert lines[f'refinery_requests_total{{endpoint="chat",{labels},status="400",'
                 'strategy="passthrough"}'] == 1
    assert lines[f'refinery_tokens_total{{kind="completion",{labels},'
                 'strategy="passthrough"}'] == 4
