"""Schemathesis against the server's own OpenAPI schema, over the real engine.

Every operation in ``app.openapi()`` gets generated requests (schema-valid
"positive" ones and schema-violating "negative" ones for the POST bodies),
sent over real HTTP to a real uvicorn server in front of the real vLLM engine.
Each answer must be: below 500, in the OpenAI error schema when 4xx, and in
the documented response schema when 2xx (checked both by Schemathesis's
conformance checks and against refinery's own pydantic models). Afterwards
the server must still be healthy and still answer a real request.

The per-request limits are tiny, so a valid generated request costs at most
two model calls of a few tokens each. A random ``model`` string would almost
always be a 404, so two thirds of the POST bodies get the served model (or a cheap
strategy spec) put in ``model``, to reach the engine.

Reproduce: ``REFINERY_FUZZ_SEED=<seed> pytest tests/serving/test_fuzz.py``;
every failure is printed with a curl command that replays it.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from refinery.serving import ServerConfig, create_app
from refinery.serving.protocol import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionChunk,
    CompletionResponse,
    ModelList,
)
from refinery.serving.responses_protocol import ResponseEvent, ResponseObject
from tests.conftest import repeat
from tests.serving.conftest import assert_openai_error

pytestmark = pytest.mark.e2e
MODEL = "smollm2-135m"
SEED = int(os.environ.get("REFINERY_FUZZ_SEED", "20260909"))
# Generated cases per (operation, mode): ``make test-all`` runs the counts of
# docs/reliability.md, ``make test`` a quarter. The GET operations take no input,
# so Hypothesis runs them until their (one-point) input space is exhausted.
POSITIVE, NEGATIVE = repeat(80, 320), repeat(55, 220)
MIN_TOTAL_CASES = repeat(250, 1000)
PLAN = {
    ("POST", "/v1/chat/completions"): {GenerationMode.POSITIVE: POSITIVE,
                                       GenerationMode.NEGATIVE: NEGATIVE},
    ("POST", "/v1/completions"): {GenerationMode.POSITIVE: POSITIVE,
                                  GenerationMode.NEGATIVE: NEGATIVE},
    ("POST", "/v1/responses"): {GenerationMode.POSITIVE: POSITIVE // 2,
                                GenerationMode.NEGATIVE: NEGATIVE // 2},
    ("GET", "/v1/responses/{response_id}"): {GenerationMode.POSITIVE: 10},
    ("GET", "/v1/responses/{response_id}/input_items"): {GenerationMode.POSITIVE: 5},
    ("DELETE", "/v1/responses/{response_id}"): {GenerationMode.POSITIVE: 5},
    ("POST", "/v1/conversations"): {GenerationMode.POSITIVE: 10, GenerationMode.NEGATIVE: 10},
    ("GET", "/v1/conversations/{conversation_id}"): {GenerationMode.POSITIVE: 5},
    ("POST", "/v1/conversations/{conversation_id}"): {GenerationMode.POSITIVE: 5},
    ("DELETE", "/v1/conversations/{conversation_id}"): {GenerationMode.POSITIVE: 5},
    ("GET", "/v1/conversations/{conversation_id}/items"): {GenerationMode.POSITIVE: 5},
    ("POST", "/v1/conversations/{conversation_id}/items"): {GenerationMode.POSITIVE: 5},
    ("GET", "/v1/conversations/{conversation_id}/items/{item_id}"):
        {GenerationMode.POSITIVE: 5},
    ("DELETE", "/v1/conversations/{conversation_id}/items/{item_id}"):
        {GenerationMode.POSITIVE: 5},
    ("GET", "/v1/models"): {GenerationMode.POSITIVE: 20},
    ("GET", "/health"): {GenerationMode.POSITIVE: 20},
    ("GET", "/metrics"): {GenerationMode.POSITIVE: 20},
}
# What goes into a generated body's ``model`` (None: keep the generated value).
MODELS = [None, None, MODEL, MODEL, f"cot@{MODEL}", f"sc(cot, n=2)@{MODEL}"]
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]

FUZZ_CONFIG = ServerConfig(
    max_request_tokens=64, max_request_calls=2, max_request_seconds=60.0,
    max_spec_calls=2, default_max_tokens=8, max_body_bytes=256 * 1024, max_messages=64)


def sse_events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded (``[DONE]`` kept as a string)."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def check_answer(method: str, path: str, body: Any, resp: schemathesis.Response) -> None:
    """refinery's own checks of one answer (raises AssertionError on a violation)."""
    status = resp.status_code
    assert status < 500, f"server error {status}: {resp.text[:500]}"
    if 400 <= status < 500:
        assert_openai_error(resp.json(), status)
        return
    assert status == 200, f"unexpected status {status}"
    if path == "/health":
        return
    if path == "/metrics":
        assert "refinery_requests_total" in resp.text
        return
    if path == "/v1/models":
        ids = [m.id for m in ModelList.model_validate(resp.json()).data]
        assert ids[0] == MODEL
        return
    if path == "/v1/responses":
        check_response(resp)
        return
    if path.startswith(("/v1/responses/", "/v1/conversations")):  # the store's objects
        assert isinstance(resp.json(), dict), resp.text[:300]
        return
    chat = path == "/v1/chat/completions"
    # Lax validation turns "2" or 2.0 into 2: count choices as the server read n.
    n = int(body.get("n", 1)) if isinstance(body, dict) else 1
    content_type = resp.headers.get("content-type") or [""]  # a list per header name
    if content_type[0].startswith("text/event-stream"):
        events = sse_events(resp.text)
        assert events and events[-1] == "[DONE]", resp.text[-300:]
        chunk_model = ChatCompletionChunk if chat else CompletionChunk
        for ev in events[:-1]:
            if "error" in ev:  # a failure after the stream began (e.g. budget spent)
                assert_openai_error(ev, status)
            else:
                chunk_model.model_validate(ev)
        return
    model = ChatCompletionResponse if chat else CompletionResponse
    parsed = model.model_validate(resp.json())
    assert [c.index for c in parsed.choices] == list(range(n))
    u = parsed.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens


def check_response(resp: schemathesis.Response) -> None:
    """A 200 from ``POST /v1/responses``: a whole response, or events ending in ``[DONE]``."""
    content_type = resp.headers.get("content-type") or [""]
    if not content_type[0].startswith("text/event-stream"):
        assert ResponseObject.model_validate(resp.json()).status in ("completed", "incomplete")
        return
    events = sse_events(resp.text)
    assert events and events[-1] == "[DONE]", resp.text[-300:]
    parsed = [ResponseEvent.model_validate(ev) for ev in events[:-1]]
    assert parsed[0].type == "response.created"
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[-1].type in ("response.completed", "response.incomplete",
                               "response.failed", "error")


def make_case_test(op: Any, mode: GenerationMode, examples: int, label: str,
                   models: st.SearchStrategy, check: Any) -> Any:
    """A seeded Hypothesis test sending ``examples`` generated cases of ``op``."""

    @seed(SEED)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=op.as_strategy(generation_mode=mode), model=models)
    def one(case: Any, model: str | None) -> None:
        check(case, model, label)

    return one


def fuzz(url: str, schema: Any) -> tuple[collections.Counter, list[str]]:
    """Run every planned (operation, mode); return case counts and failure reports."""
    counts: collections.Counter = collections.Counter()
    statuses: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: list[str] = []
    http = requests.Session()
    ops = {(op.method.upper(), op.path): op
           for op in (r.ok() for r in schema.get_all_operations())}
    assert set(ops) == set(PLAN), f"schema operations changed: {sorted(ops)}"

    def check(case: Any, model: str | None, label: str) -> None:
        if model is not None and isinstance(case.body, dict):
            case.body["model"] = model
        counts[label] += 1
        try:
            resp = case.call(base_url=url, session=http, timeout=300)
        except requests.RequestException as exc:  # the server dropped us: a bug
            failures.append(f"{label}: {type(exc).__name__}: {exc}\n  "
                            f"{case.as_curl_command(base_url=url)}")
            return
        statuses[label][resp.status_code] += 1
        problems = []
        try:
            check_answer(case.method.upper(), case.path, case.body, resp)
        except Exception as exc:  # an assertion, or an answer that does not even parse
            problems.append(f"refinery check: {type(exc).__name__}: {exc}")
        try:
            case.validate_response(resp, checks=CHECKS)
        except (FailureGroup, Exception) as exc:  # FailureGroup is a BaseExceptionGroup
            problems.append(f"schemathesis: {exc}")
        if problems:
            failures.append(f"{label}: status {resp.status_code}: "
                            + " | ".join(problems)[:1500]
                            + f"\n  reproduce: {case.as_curl_command(base_url=url)}")

    for (method, path), modes in PLAN.items():
        op = ops[(method, path)]
        for mode, examples in modes.items():
            label = f"{method} {path} [{mode.value}]"
            models = st.sampled_from(MODELS) if method == "POST" else st.just(None)

            make_case_test(op, mode, examples, label, models, check)()
    http.close()
    print(f"\nfuzz seed {SEED}; cases per operation and mode:")
    for label, n in counts.items():
        print(f"  {label}: {n} cases, statuses {dict(sorted(statuses[label].items()))}")
    for failure in failures[:10]:
        print(failure)
    return counts, failures


async def test_schemathesis_over_the_real_engine(serve, vllm_backend):
    app_schema = create_app(FUZZ_CONFIG, backend=vllm_backend).openapi()
    schema = schemathesis.openapi.from_dict(app_schema)
    # Sanitization would print max_tokens as "[Filtered]" ("token" looks secret to it),
    # and the curl commands must replay the exact case.
    schema.config.output.sanitization.enabled = False
    url = await serve(FUZZ_CONFIG)
    # Blocking HTTP client in a worker thread: the server runs in this loop.
    counts, failures = await asyncio.to_thread(fuzz, url, schema)

    assert not failures, f"{len(failures)} failing cases (seed {SEED}):\n" + "\n".join(
        failures[:15])
    total = sum(counts.values())
    assert total >= MIN_TOTAL_CASES, counts
    for label in ("POST /v1/chat/completions", "POST /v1/completions"):
        assert counts[f"{label} [positive]"] >= POSITIVE * 15 // 16
        assert counts[f"{label} [negative]"] >= NEGATIVE * 10 // 11
    for label in ("GET /v1/models", "GET /health", "GET /metrics"):
        assert counts[f"{label} [positive]"] >= 1

    # The server is healthy afterwards and still serves the real model.
    async with httpx.AsyncClient(base_url=url, timeout=120) as h:
        assert (await h.get("/health")).status_code == 200
        r = await h.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi."}]})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
    assert vllm_backend.healthy
