"""Drop-in for the clients people already run, on the scripted backend.

OptiLLM's own ``tests/test_api_compatibility.py`` checks, through the official
``openai`` SDK against a real uvicorn: basic chat, ``n``, the ``APPROACH-MODEL``
prefix, ``extra_body={"optillm_approach": ...}``, streaming, and
``usage.completion_tokens_details.reasoning_tokens`` on plain, ``n=2`` and
strategy responses. Then refinery's own rules: the exact reasoning-token
arithmetic, cached prompt tokens, the OptiLLM name mapping, the 400 for an
approach refinery does not implement, and served model names with dashes.
"""

from __future__ import annotations

import itertools

import openai
import pytest

from refinery.serving import ServerConfig
from tests.scripted_backend import ScriptedBackend
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    COMPLETIONS,
    MODEL,
    assert_openai_error,
    chat,
    scripted,
    sse_data,
)

pytestmark = pytest.mark.timeout(60)

Q = [{"role": "user", "content": "What is 2+2?"}]
SAMPLES = ["two and two make \\boxed{4}", "\\boxed{5}", "it is \\boxed{4}"]  # 5, 1, 3 words
SC = f"sc(cot, n=3)@{MODEL}"
CRITIQUE = "All three drafts are right."  # 5 words
SYNTHESIS = "So 2 + 2 = 4. \\boxed{4}"  # 7 words


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def moa_backend(**knobs) -> ScriptedBackend:
    """moa's three drafts (ANSWER, 4 words each), its critique and its synthesis."""
    return ScriptedBackend([(r"Write one complete solution", SYNTHESIS),
                            (r"careful examiner", CRITIQUE), (r".*", ANSWER)], **knobs)


def details(body: dict) -> int:
    """``usage.completion_tokens_details.reasoning_tokens`` of a JSON body or chunk."""
    return body["usage"]["completion_tokens_details"]["reasoning_tokens"]


# -- OptiLLM's API compatibility tests, through the SDK ---------------------------------

async def test_basic_completion_has_reasoning_tokens_zero(scripted_serve):
    url, _ = await scripted_serve()
    r = await sdk(url).chat.completions.create(
        model=MODEL, max_tokens=10, messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello"}])
    assert r.choices[0].message.content == ANSWER
    reasoning = r.usage.completion_tokens_details.reasoning_tokens
    assert isinstance(reasoning, int) and reasoning == 0


async def test_n_choices_differ_and_report_reasoning_tokens(scripted_serve):
    count = itertools.count()
    backend = ScriptedBackend([(r".*", lambda m, p, i: f"Joke number {next(count)}.")])
    url, _ = await scripted_serve(backend=backend)
    r = await sdk(url).chat.completions.create(model=MODEL, messages=Q, n=3,
                                               temperature=0.8, max_tokens=50)
    assert len(r.choices) == 3
    assert len({c.message.content for c in r.choices}) == 3
    r2 = await sdk(url).chat.completions.create(model=MODEL, messages=Q, n=2, max_tokens=50)
    assert len(r2.choices) == 2
    assert r2.usage.completion_tokens_details.reasoning_tokens == 0


async def test_approach_prefix_runs_the_strategy(scripted_serve):
    backend = moa_backend()
    url, _ = await scripted_serve(backend=backend)
    r = await sdk(url).chat.completions.create(model=f"moa-{MODEL}", messages=Q,
                                               max_tokens=10)
    assert r.model_extra["refinery"]["strategy"] == "moa(cot)"
    assert r.choices[0].message.content == SYNTHESIS
    assert [c.n for c in backend.calls] == [3, 1, 1]  # the drafts, the critique, the synthesis
    assert "careful examiner" in backend.calls[1].messages[-1].content
    u = r.usage
    assert u.completion_tokens == 3 * 4 + 5 + 7
    assert u.completion_tokens_details.reasoning_tokens == 3 * 4 + 5  # all but the synthesis


async def test_extra_body_approach_runs_best_of_n(scripted_serve):
    backend = ScriptedBackend([(r"grading a solution", "Checked. Score: 7"), (r".*", ANSWER)])
    url, _ = await scripted_serve(backend=backend)
    r = await sdk(url).chat.completions.create(model=MODEL, messages=Q, max_tokens=10,
                                               extra_body={"optillm_approach": "bon"})
    assert r.model_extra["refinery"]["strategy"] == "best_of_n(cot, n=3)"
    assert r.choices[0].message.content == ANSWER
    assert [c.n for c in backend.calls] == [3, 1, 1, 1]  # three samples, three grades
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens


async def test_streaming_role_first_then_content(scripted_serve):
    url, _ = await scripted_serve()
    stream = await sdk(url).chat.completions.create(model=MODEL, messages=Q, stream=True,
                                                    max_tokens=50)
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER


@pytest.mark.parametrize("spec,expected", [(MODEL, 0), (SC, 9 - 5)])
async def test_streamed_usage_chunk_has_the_reasoning_tokens(scripted_serve, spec, expected):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", SAMPLES)]))
    stream = await sdk(url).chat.completions.create(
        model=spec, messages=Q, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    reasoning = usage.completion_tokens_details.reasoning_tokens
    assert isinstance(reasoning, int) and reasoning == expected


# -- reasoning tokens: the exact arithmetic ----------------------------------------------

@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_reasoning_tokens_are_all_but_the_answer_sample(scripted_serve, client, path):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", SAMPLES)]))
    body = (chat(model=SC) if path == CHAT else {"model": SC, "prompt": "2+2?"})
    r = (await client.post(url + path, json=body)).json()
    # 5 + 1 + 3 generated; the first sample of the winning "4" group (5 words) returned.
    assert r["usage"]["completion_tokens"] == 9
    assert details(r) == 9 - 5
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 9  # totals unchanged


async def test_reasoning_tokens_of_n_choices_sum_over_the_choices(scripted_serve, client):
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", SAMPLES)]))
    r = (await client.post(url + CHAT, json=chat(model=SC, n=2))).json()
    assert r["usage"]["completion_tokens"] == 18
    assert details(r) == 18 - 5 - 5


async def test_stream_and_whole_response_count_alike(scripted_serve, client):
    url, _ = await scripted_serve(backend=moa_backend())
    whole = (await client.post(url + CHAT, json=chat(model=f"moa-{MODEL}"))).json()
    r = await client.post(url + CHAT, json=chat(model=f"moa-{MODEL}", stream=True,
                                                stream_options={"include_usage": True}))
    last = sse_data(r.text)[-2]
    assert last["usage"] == whole["usage"]
    assert details(last) == 3 * 4 + 5


async def test_with_a_response_format_the_strategy_is_all_reasoning(scripted_serve, client):
    def reply(messages, params, i) -> str:
        return '{"answer": 4}' if params.constraint is not None else SAMPLES[i % 3]

    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", reply)]))
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    r = (await client.post(url + CHAT, json=chat(model=SC, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": schema}}))).json()
    assert r["choices"][0]["message"]["content"] == '{"answer": 4}'
    assert r["usage"]["completion_tokens"] == 9 + 2  # the format call's 2 "tokens"
    assert details(r) == 9


async def test_an_answer_cut_out_of_a_reply_counts_it_all_as_reasoning(scripted_serve, client):
    reply = "<thinking>2+2</thinking><reflection>fine</reflection><output>\\boxed{4}</output>"
    url, _ = await scripted_serve(backend=ScriptedBackend([(r".*", reply)]))
    r = (await client.post(url + CHAT, json=chat(model=f"cot_reflection-{MODEL}"))).json()
    assert r["choices"][0]["message"]["content"] == "\\boxed{4}"
    assert details(r) == r["usage"]["completion_tokens"] == 1


# -- cached prompt tokens ----------------------------------------------------------------

async def test_cached_tokens_when_the_backend_reports_them(scripted_serve, client):
    url, _ = await scripted_serve(backend=moa_backend(cached_tokens=3))
    plain = (await client.post(url + CHAT, json=chat())).json()
    assert plain["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    moa = (await client.post(url + CHAT, json=chat(model=f"moa-{MODEL}"))).json()
    assert moa["refinery"]["calls"] == 3  # the drafts' shared prompt counts once
    assert moa["usage"]["prompt_tokens_details"] == {"cached_tokens": 3 * 3}
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                                   "stream": True,
                                                   "stream_options": {"include_usage": True}})
    assert sse_data(r.text)[-2]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}


async def test_no_cached_tokens_field_when_unknown(scripted_serve, client):
    url, _ = await scripted_serve()
    r = (await client.post(url + CHAT, json=chat())).json()
    assert "prompt_tokens_details" not in r["usage"]
    usage = (await sdk(url).chat.completions.create(model=MODEL, messages=Q)).usage
    assert usage.prompt_tokens_details is None


# -- OptiLLM names -----------------------------------------------------------------------

@pytest.mark.parametrize("approach,strategy", [
    ("moa", "moa(cot)"), ("bon", "best_of_n(cot, n=3)"), ("self_consistency", "sc(cot, n=5)"),
    ("re2", "re2"), ("cot_reflection", "cot_reflection"), ("deepconf", "deepconf(cot)")])
async def test_every_supported_approach_maps_to_its_spec(scripted_serve, client, approach,
                                                         strategy):
    backend = ScriptedBackend([(r"grading a solution", "Score: 7"), (r".*", ANSWER)])
    url, _ = await scripted_serve(backend=backend)
    by_prefix = (await client.post(url + CHAT, json=chat(model=f"{approach}-{MODEL}"))).json()
    by_body = (await client.post(url + CHAT, json=chat(optillm_approach=approach))).json()
    assert by_prefix["refinery"]["strategy"] == by_body["refinery"]["strategy"] == strategy


async def test_none_and_auto(scripted_serve, client):
    url, _ = await scripted_serve(ServerConfig(default_strategy="sc(cot, n=2)"))
    for body in (chat(model=f"none-{MODEL}"), chat(optillm_approach="none")):
        r = (await client.post(url + CHAT, json=body)).json()
        assert r["refinery"].get("strategy") is None  # passthrough despite the default strategy
    r = (await client.post(url + CHAT, json=chat(model=f"re2-{MODEL}",
                                                 optillm_approach="auto"))).json()
    assert r["refinery"]["strategy"] == "re2"  # auto: the model field decides
    r = (await client.post(url + CHAT, json=chat(optillm_approach="moa",
                                                 refinery={"strategy": "cot"}))).json()
    assert r["refinery"]["strategy"] == "cot"  # refinery.strategy wins


@pytest.mark.parametrize("approach,closest", [
    ("rto", "critique_refine"), ("plansearch", "sage(cot)"),
    ("leap", "cot"), ("majority_voting", "sc(cot)")])
async def test_an_unimplemented_approach_is_a_400_naming_the_closest(scripted_serve, client,
                                                                      approach, closest):
    backend = scripted()
    url, _ = await scripted_serve(backend=backend)
    with pytest.raises(openai.BadRequestError) as exc:
        await sdk(url).chat.completions.create(model=f"{approach}-{MODEL}", messages=Q)
    assert exc.value.status_code == 400
    err = exc.value.body
    assert f"closest here: {closest}" in err["message"] and "moa" in err["message"]
    assert (err["param"], err["code"]) == ("model", "approach_not_supported")
    r = await client.post(url + CHAT, json=chat(optillm_approach=approach))
    assert assert_openai_error(r.json(), r.status_code)["param"] == "optillm_approach"
    assert r.status_code == 400 and backend.calls == []


@pytest.mark.parametrize("model", [f"moa&re2-{MODEL}", f"moa|bon-{MODEL}",
                                   f"privacy-moa-{MODEL}"])
async def test_combined_approaches_are_a_400(scripted_serve, client, model):
    url, _ = await scripted_serve()
    r = await client.post(url + CHAT, json=chat(model=model))
    assert r.status_code == 400
    assert "combining approaches" in assert_openai_error(r.json())["message"]
    r = await client.post(url + CHAT, json=chat(optillm_approach="cot_reflection&re2"))
    assert r.status_code == 400


async def test_an_unknown_prefix_is_an_unknown_model(scripted_serve, client):
    url, _ = await scripted_serve()
    for model in (f"foo-{MODEL}", f"-{MODEL}", "moa-other-model", "moa"):
        r = await client.post(url + CHAT, json=chat(model=model))
        assert r.status_code == 404, model
        err = assert_openai_error(r.json())
        assert err["code"] == "model_not_found" and f"APPROACH-{MODEL}" in err["message"]
    r = await client.post(url + CHAT, json=chat(optillm_approach="foo"))
    assert r.status_code == 400


@pytest.mark.parametrize("served", ["Qwen2.5-0.5B-Instruct", "moa-lite"])
async def test_served_names_with_dashes_are_never_split(scripted_serve, client, served):
    url, _ = await scripted_serve(ServerConfig(model=served))
    r = (await client.post(url + CHAT, json=chat(model=served))).json()
    assert r["refinery"].get("strategy") is None and r["model"] == served
    r = (await client.post(url + CHAT, json=chat(model=f"re2-{served}"))).json()
    assert r["refinery"]["strategy"] == "re2"
    for partial in (served.rsplit("-", 1)[0], served.split("-", 1)[1], f"{served}-x"):
        assert (await client.post(url + CHAT, json=chat(model=partial))).status_code == 404


async def test_models_lists_the_presets_not_the_prefixed_names(scripted_serve, client):
    url, _ = await scripted_serve()
    ids = [m["id"] for m in (await client.get(url + "/v1/models")).json()["data"]]
    assert {f"moa@{MODEL}", f"re2@{MODEL}", f"cot_reflection@{MODEL}"} <= set(ids)
    assert not any(i.startswith("moa-") for i in ids)
    r = (await client.post(url + CHAT, json=chat(model=f"cot_reflection@{MODEL}"))).json()
    assert r["refinery"]["strategy"] == "cot_reflection"
