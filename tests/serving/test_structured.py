"""Structured outputs over HTTP on the scripted backend: response_format and vLLM's
fields reach the backend as the right Constraint, under a strategy the one extra
shaping call happens, bad constraints are a 400 before any engine call, and the
official SDK's ``parse()`` works against the server."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from refinery.serving import ServerConfig
from tests.serving.conftest import CHAT, COMPLETIONS, MODEL, assert_openai_error, chat, sse_data
from tests.serving.structured_util import (
    JSON_ANSWER,
    SCHEMA,
    SOLUTION,
    constraints,
    shaped_backend,
)

pytestmark = pytest.mark.timeout(60)  # uvicorn catches SIGTERM: never hang a run
SC = f"sc(cot, n=2)@{MODEL}"


def json_schema(schema=None, **extra) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema or SCHEMA, **extra}}


def nested(depth: int) -> dict:
    """A schema of arrays of arrays... ``depth`` levels deep."""
    schema: dict = {}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


async def refused(client, url: str, body: dict, backend, path: str = CHAT) -> dict:
    """POST ``body``; assert a 400 in the OpenAI shape and no engine call; the error."""
    # json.dumps escapes a lone surrogate (httpx's own encoding cannot send one).
    r = await client.post(url + path, content=json.dumps(body),
                          headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = assert_openai_error(r.json(), 400)
    assert err["type"] == "invalid_request_error"
    assert backend.calls == []
    return err


# -- passthrough: the one generation carries the constraint ------------------------------

async def test_json_schema_reaches_the_backend_as_the_schema_constraint(scripted_serve,
                                                                      client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(response_format=json_schema(strict=True)))
    assert r.status_code == 200, r.text
    [c] = constraints(backend)
    assert c.kind == "json" and c.json_schema == SCHEMA and c.name == "answer"
    msg = r.json()["choices"][0]["message"]
    assert msg["content"] == JSON_ANSWER and msg["refusal"] is None
    assert "reasoning_content" not in msg
    assert len(backend.calls) == 1


@pytest.mark.parametrize(("fields", "kind", "value"), [
    ({"response_format": {"type": "json_object"}}, "json_object", True),
    ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "[0-9]+"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", ("yes", "no")),
    ({"structured_outputs": {"grammar": "root ::= \"yes\""}}, "grammar", "root ::= \"yes\""),
    ({"structured_outputs": {"json": SCHEMA}}, "json", SCHEMA),
    ({"structured_outputs": {"json": '{"type": "object"}'}}, "json", {"type": "object"}),
    ({"structured_outputs": {"json_object": True}}, "json_object", True),
    ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
    ({"guided_choice": ["yes", "no"]}, "choice", ("yes", "no")),
    ({"guided_json": SCHEMA}, "json", SCHEMA),
    ({"guided_grammar": "root ::= \"yes\""}, "grammar", "root ::= \"yes\""),
])
async def test_every_kind_reaches_the_backend(scripted_serve, client, fields, kind, value):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(**fields))
    assert r.status_code == 200, r.text
    [c] = constraints(backend)
    field = {"json": "json_schema"}.get(kind, kind)
    assert c.kind == kind and getattr(c, field) == value


async def test_text_format_is_no_constraint_and_vllm_options_are_accepted(scripted_serve,
                                                                          client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    await client.post(url + CHAT, json=chat(response_format={"type": "text"}))
    r = await client.post(url + CHAT, json=chat(
        response_format=json_schema(), structured_outputs={"disable_any_whitespace": True}))
    assert r.status_code == 200, r.text
    first, second = constraints(backend)
    assert first is None and second.kind == "json"


async def test_completions_take_response_format_and_vllm_fields(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                                   "response_format": json_schema()})
    assert r.json()["choices"][0]["text"] == JSON_ANSWER
    await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                               "guided_choice": ["4", "5"]})
    assert [c.kind for c in constraints(backend)] == ["json", "choice"]


# -- refused before any engine call --------------------------------------------------------

@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": json_schema({"type": "objekt"})},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex"),
    ({"guided_regex": "[z-a]"}, "guided_regex"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag"),
    ({"response_format": json_schema(), "guided_regex": "[0-9]+"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"response_format": json_schema(nested(100))}, "response_format.json_schema.schema"),
    ({"guided_json": {"enum": ["\ud800"]}}, "guided_json"),  # a lone surrogate
])
async def test_bad_or_doubled_constraints_are_400_without_an_engine_call(
        scripted_serve, client, fields, param):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    err = await refused(client, url, chat(**fields), backend)
    assert err["param"] == param
    # The same under a strategy, and streamed: refused before the stream begins.
    await refused(client, url, chat(model=SC, stream=True, **fields), backend)


async def test_a_kind_the_backend_cannot_enforce_is_400_naming_it(scripted_serve, client):
    backend = shaped_backend(structured_outputs=frozenset({"json", "json_object"}))
    url, _ = await scripted_serve(backend=backend)
    err = await refused(client, url, chat(guided_grammar="root ::= \"a\""), backend)
    assert err["code"] == "unsupported_constraint" and "'grammar'" in err["message"]
    assert "scripted" in err["message"]


# -- under a strategy: the strategy solves, one constrained call shapes the answer ----------

async def test_under_a_strategy_one_final_call_shapes_the_answer(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(model=SC, response_format=json_schema(),
                                                temperature=0.9))
    assert r.status_code == 200, r.text
    *steps, final = backend.calls
    assert steps and all(c.params.constraint is None for c in steps)
    assert final.params.constraint.json_schema == SCHEMA
    assert final.params.temperature == 0.0
    assert final.messages[-2].role == "assistant" and final.messages[-2].content == SOLUTION
    body = r.json()
    msg = body["choices"][0]["message"]
    assert msg["content"] == JSON_ANSWER and msg["reasoning_content"] == SOLUTION
    assert body["refinery"]["calls"] == len(backend.calls)


async def test_under_a_strategy_the_shaped_answer_streams_as_content(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await client.post(url + CHAT, json=chat(model=f"cot@{MODEL}", stream=True,
                                                response_format=json_schema()))
    events = sse_data(r.text)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    deltas = [c["choices"][0]["delta"] for c in events[:-1] if c["choices"]]
    assert SOLUTION in "".join(d.get("reasoning_content", "") for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == JSON_ANSWER
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


async def test_default_strategy_plain_model_gets_the_final_call_too(scripted_serve, client):
    backend = shaped_backend()
    url, _ = await scripted_serve(ServerConfig(default_strategy="cot"), backend=backend)
    r = await client.post(url + CHAT, json=chat(response_format={"type": "json_object"}))
    assert r.json()["choices"][0]["message"]["content"] == '{"a": 1}'
    assert [c is None for c in constraints(backend)] == [True, False]


# -- the official SDK ----------------------------------------------------------------------

class Result(BaseModel):
    answer: int


@pytest.mark.parametrize("model", [MODEL, f"sc(cot, n=4)@{MODEL}"])
async def test_sdk_parse_with_a_pydantic_model(scripted_serve, model):
    backend = shaped_backend()
    url, _ = await scripted_serve(backend=backend)
    sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = await sdk.chat.completions.parse(model=model, response_format=Result,
                                         messages=[{"role": "user", "content": "2+2?"}])
    assert r.choices[0].message.parsed == Result(answer=4)
    if "@" in model:  # the strategy's solution rides along as reasoning_content
        assert r.choices[0].message.model_extra["reasoning_content"] == SOLUTION
    sent = constraints(backend)[-1]
    assert sent.name == "Result" and sent.json_schema["required"] == ["answer"]
    assert sent.json_schema["additionalProperties"] is False  # the SDK's strict schema


async def test_the_documented_message_schema_keeps_its_fields(scripted_serve, client):
    url, _ = await scripted_serve()
    schemas = (await client.get(url + "/openapi.json")).json()["components"]["schemas"]
    message = next(v for k, v in schemas.items() if k.startswith("ResponseMessage"))
    assert {"content", "refusal", "tool_calls", "reasoning_content"} <= set(
        message["properties"])
