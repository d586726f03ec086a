"""OpenAIBackend against vLLM's own OpenAI server and against fault servers."""

from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from refinery.engine.backends.openai import OpenAIBackend, OpenAIConfig, split_tokens
from refinery.engine.backends.upstream_guard import UpstreamGuard
from refinery.engine.constraints import Constraint, UnsupportedConstraintError
from refinery.engine.errors import (
    BackendUnavailableError,
    InvalidRequestError,
    UnknownModelError,
)
from refinery.engine.loops import CusumLoopDetector
from refinery.engine.models import DEFAULT_MODEL
from refinery.engine.types import Message, SamplingParams
from tests.servers import ThreadedApp, free_port

Q = [Message(role="user", content="What is 2+2? Answer briefly.")]


def ok_body(text: str = "4") -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}


class FaultServer(ThreadedApp):
    """Answers ``failures`` errors (cycling through ``statuses``), then succeeds.

    ``retry_after`` (seconds, a string as sent) goes out with every 429;
    ``GET /v1/models`` always answers (and is counted); ``port`` lets a test start
    the server on a port a backend already points at.
    """

    def __init__(self, failures: int, statuses=(429, 503), retry_after: str | None = None,
                 port: int | None = None):
        self.failures, self.statuses, self.hits = failures, statuses, []
        self.retry_after = retry_after
        self.model_probes = 0
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat():
            self.hits.append(time.monotonic())
            i = len(self.hits) - 1
            if i < self.failures:
                status = self.statuses[i % len(self.statuses)]
                headers = ({"Retry-After": self.retry_after}
                           if status == 429 and self.retry_after is not None else None)
                return JSONResponse({"error": {"message": "busy", "type": "x"}},
                                    status_code=status, headers=headers)
            return ok_body()

        @app.get("/v1/models")
        async def models():
            self.model_probes += 1
            return {"object": "list", "data": [{"id": "m", "object": "model"}]}

        super().__init__(app, port)


def choice(text: str | None, finish: str = "stop") -> SimpleNamespace:
    return SimpleNamespace(finish_reason=finish, message=SimpleNamespace(content=text))


def test_split_tokens_gives_length_finishes_max_tokens_and_shares_the_rest_exactly():
    three = [choice("x" * 10, "length"), choice("y" * 150), choice("z" * 50)]
    assert split_tokens(300, three, 128) == [128, 129, 43]
    assert split_tokens(256, [choice("a", "length"), choice("b", "length")], 128) == [128, 128]
    # Two "length" finishes cannot hold 128 each in 100 tokens: shared by text length.
    assert split_tokens(100, [choice("a" * 29, "length"), choice("b" * 9, "length")], 128) \
        == [75, 25]
    counts = split_tokens(7, [choice("same"), choice("same"), choice("same")], 16)
    assert sorted(counts) == [2, 2, 3] and sum(counts) == 7
    assert split_tokens(5, [choice(None), choice("")], 16) in ([3, 2], [2, 3])
    assert split_tokens(0, [choice("a"), choice("b")], 16) == [0, 0]
    assert split_tokens(40, [choice("whatever")], 16) == [40] and split_tokens(3, [], 8) == []



def quick(**changes) -> OpenAIConfig:
    """Five retries with millisecond backoff: a fault server's storm in a test's time."""
    return OpenAIConfig(**{"max_retries": 5, "backoff_initial": 0.01, "backoff_max": 0.05,
                           **changes})

async def test_retries_429_and_503_then_succeeds():
    fault = FaultServer(failures=3)
    with fault as url:
        be = OpenAIBackend("m", url, config=OpenAIConfig(backoff_initial=0.05, backoff_max=0.2))
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
        await be.aclose()
    assert c.text == "4" and c.prompt_tokens == 5
    assert len(fault.hits) == 4  # three refusals, then the success
    gaps = [b - a for a, b in zip(fault.hits, fault.hits[1:], strict=False)]
    assert all(g >= 0.02 for g in gaps)  # backed off, not hammered


async def test_always_failing_server_gives_clear_error_after_budget():
    fault = FaultServer(failures=10**6, statuses=(503,))
    with fault as url:
        be = OpenAIBackend("m", url, config=quick(max_retries=3))
        with pytest.raises(BackendUnavailableError, match="503 after retries"):
            await asyncio.wait_for(be.generate(Q, SamplingParams(max_tokens=4)), 30)
        await be.aclose()
    assert len(fault.hits) == 4  # 1 try + 3 retries, then it stops


async def test_unreachable_server_is_a_clear_error():
    be = OpenAIBackend("m", f"http://127.0.0.1:{free_port()}/v1",
                       config=OpenAIConfig(max_retries=1, backoff_initial=0.01))
    with pytest.raises(BackendUnavailableError, match="unreachable"):
        await be.generate(Q, SamplingParams(max_tokens=4))
    await be.aclose()


@pytest.mark.e2e
async def test_against_vllm_openai_server(vllm_server):
    be = OpenAIBackend(DEFAULT_MODEL, vllm_server)
    [c] = await be.generate(Q, SamplingParams(temperature=0, max_tokens=24))
    assert "4" in c.text and c.prompt_tokens > 0 and c.completion_tokens > 0
    outs = await be.generate(Q, SamplingParams(temperature=1.0, max_tokens=16), n=3)
    assert len(outs) == 3
    # Under the loop detector a short call is one request, checked whole; n greedy
    # samples (vLLM refuses them in one request) go as n streamed requests.
    greedy = SamplingParams(temperature=0, max_tokens=24)
    [w] = await be.generate(Q, greedy, stop_rule=CusumLoopDetector())
    assert (w.text, w.completion_tokens) == (c.text, c.completion_tokens)
    ws = await be.generate(Q, greedy, n=2, stop_rule=CusumLoopDetector())
    assert [w.text for w in ws] == [c.text, c.text]
    pieces, final = [], None
    async for d in be.stream(Q, SamplingParams(temperature=0, max_tokens=24)):
        pieces.append(d.text)
        final = d.completion or final
    assert "".join(pieces) == final.text == c.text
    assert final.completion_tokens == c.completion_tokens
    many = await asyncio.gather(*(be.generate(Q, SamplingParams(max_tokens=8))
                                  for _ in range(8)))
    assert all(m[0].completion_tokens > 0 for m in many)
    with pytest.raises(UnknownModelError):
        await OpenAIBackend("nope", vllm_server, config=OpenAIConfig(max_retries=0)).generate(
            Q, SamplingParams(max_tokens=4))
    await be.aclose()


@pytest.mark.e2e
async def test_constraints_and_logprobs_through_a_vllm_server(vllm_server):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"], "additionalProperties": False}
    as_openai = OpenAIBackend(DEFAULT_MODEL, vllm_server)  # response_format only
    as_vllm = OpenAIBackend(DEFAULT_MODEL, vllm_server, config=OpenAIConfig(upstream="vllm"))
    json_c = Constraint.from_schema(schema, name="sum")
    for be in (as_openai, as_vllm):
        outs = await be.generate(Q, SamplingParams(max_tokens=64, n=3, constraint=json_c))
        assert all(json_c.accepts(o.text) for o in outs), [o.text for o in outs]
    regex = Constraint.from_regex(r"The answer is [0-9]+\.")
    with pytest.raises(UnsupportedConstraintError, match="regex"):
        await as_openai.generate(Q, SamplingParams(max_tokens=16, constraint=regex))
    [r] = await as_vllm.generate(Q, SamplingParams(max_tokens=16, constraint=regex))
    assert regex.accepts(r.text), r.text
    choice = Constraint.one_of(["four", "five"])
    streamed = "".join([d.text async for d in as_vllm.stream(
        Q, SamplingParams(max_tokens=8, constraint=choice))])
    assert streamed in ("four", "five")
    lp = SamplingParams(temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
    [c] = await as_openai.generate(Q, lp)
    assert len(c.token_logprobs) == c.completion_tokens
    assert all(len(t.top_logprobs) == 2 for t in c.token_logprobs)
    # the end-of-turn token is scored too, as vLLM's server reports it
    assert "".join(t.token for t in c.token_logprobs).startswith(c.text)
    last = None
    async for d in as_openai.stream(Q, lp):
        last = d
    assert [t.token for t in last.completion.token_logprobs] == \
        [t.token for t in c.token_logprobs]
    await as_openai.aclose()
    await as_vllm.aclose()


async def test_an_unsupported_constraint_sends_nothing():
    hits = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        hits.append(1)
        return JSONResponse(ok_body())

    with ThreadedApp(app) as url:
        be = OpenAIBackend("m", url)
        c = Constraint.from_grammar('root ::= "a"')
        with pytest.raises(UnsupportedConstraintError, match="grammar"):
            await be.generate(Q, SamplingParams(max_tokens=4, constraint=c))
        with pytest.raises(UnsupportedConstraintError):
            await be.generate(Q, SamplingParams(max_tokens=4, constraint=c),
                              stop_rule=CusumLoopDetector())
        await be.aclose()
    assert hits == [] and be.healthy


async def test_thinking_token_budget_goes_to_a_vllm_upstream_only():
    bodies = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        bodies.append(await request.json())
        return JSONResponse(ok_body())

    params = SamplingParams(max_tokens=4, thinking_token_budget=32)
    with ThreadedApp(app) as url:
        as_vllm = OpenAIBackend("m", url, config=OpenAIConfig(upstream="vllm"))
        await as_vllm.generate(Q, params)
        as_openai = OpenAIBackend("m", url)
        with pytest.raises(InvalidRequestError, match="thinking_token_budget is vLLM's"):
            await as_openai.generate(Q, params)
        await as_vllm.aclose()
        await as_openai.aclose()
    assert [b.get("thinking_token_budget") for b in bodies] == [32]


# -- storms: ride them out, honour Retry-After, never amplify ------------------------------


async def test_mixed_storm_with_retry_after_is_ridden_out():
    # One of each: 429 (Retry-After: 1), 500, 502, 503, then the answer.
    fault = FaultServer(failures=4, statuses=(429, 500, 502, 503), retry_after="1")
    with fault as url:
        be = OpenAIBackend("m", url, config=quick())
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
        await be.aclose()
    assert c.text == "4"
    assert len(fault.hits) == 5 <= 1 * (be.config.max_retries + 1)
    # A sleep never ends early, so this lower bound cannot flake: the backoff alone
    # is <= 0.06 s, the 1 s gap can only come from honouring Retry-After.
    assert fault.hits[1] - fault.hits[0] >= 1.0
    assert be.guard.consecutive_failures == 0 and be.healthy


async def test_retry_after_past_the_deadline_fails_at_once():
    fault = FaultServer(failures=10**6, statuses=(429,), retry_after="3600")
    with fault as url:
        be = OpenAIBackend("m", url, config=OpenAIConfig(max_retry_seconds=20,
                                                         max_retry_after=7200))
        with pytest.raises(BackendUnavailableError, match="past the retry deadline") as err:
            await be.generate(Q, SamplingParams(max_tokens=4))
        await be.aclose()
    assert err.value.status == 503
    assert len(fault.hits) == 1  # no retry: waiting an hour would outlive the call


async def test_concurrent_storm_is_not_amplified_by_retries():
    n, budget = 12, 10
    fault = FaultServer(failures=10**6, statuses=(503, 500, 502))
    with fault as url:
        be = OpenAIBackend("m", url, config=quick(retry_budget=budget,
                                                  breaker_threshold=10**6))
        results = await asyncio.gather(
            *(be.generate(Q, SamplingParams(max_tokens=4)) for _ in range(n)),
            return_exceptions=True)
        await be.aclose()
    assert all(isinstance(r, BackendUnavailableError) for r in results), results
    max_attempts = be.config.max_retries + 1
    naive = n * max_attempts  # 72: what per-request retries alone would send
    # The shared budget allows retries only while more than half of it is left.
    assert len(fault.hits) <= n + budget // 2 < naive
    assert be.guard.retries_denied >= 1
    assert any("retry budget spent" in str(r) for r in results)


async def test_circuit_opens_fails_fast_then_half_opens_after_cooldown():
    fault = FaultServer(failures=3, statuses=(502,))
    with fault as url:
        now = [0.0]  # the breaker's clock: the test moves it past the cooldown
        be = OpenAIBackend("m", url, config=quick(breaker_threshold=3, breaker_cooldown=1.0),
                           clock=lambda: now[0])
        with pytest.raises(BackendUnavailableError, match="circuit breaker opened"):
            await be.generate(Q, SamplingParams(max_tokens=4))
        assert len(fault.hits) == 3 and not be.healthy
        with pytest.raises(BackendUnavailableError, match="circuit open") as err:
            await be.generate(Q, SamplingParams(max_tokens=4))
        assert err.value.code == "upstream_circuit_open"
        assert len(fault.hits) == 3  # refused without touching the upstream
        # /models answers during an error storm: a probe must not reopen the floodgates.
        assert not await be.check_health() and not be.healthy
        assert fault.model_probes == 1
        now[0] += 0.9
        assert not be.healthy  # still inside the cooldown
        now[0] += 0.2
        assert be.healthy
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
        await be.aclose()
    assert c.text == "4" and len(fault.hits) == 4


async def test_health_follows_upstream_reachability():
    port = free_port()
    be = OpenAIBackend("m", f"http://127.0.0.1:{port}/v1",
                       config=OpenAIConfig(max_retries=0, breaker_cooldown=3600))
    assert not await be.check_health() and not be.healthy
    assert "upstream unavailable" in be.status
    be._health_checked = 0.0  # skip the one-probe-per-second limit for the test
    fault = FaultServer(failures=0, port=port)
    with fault:
        assert await be.check_health() and be.healthy
        [c] = await be.generate(Q, SamplingParams(max_tokens=4))
    await be.aclose()
    assert c.text == "4"


def test_guard_budget_refills_on_success():
    t = [0.0]
    g = UpstreamGuard(budget=4, token_ratio=0.5, breaker_threshold=100, clock=lambda: t[0])
    exc = RuntimeError("x")
    g.failure(exc)
    assert g.retry_allowed()  # 3 > 2
    g.failure(exc)
    assert not g.retry_allowed()  # 2 is not > 2
    g.success()
    g.success()
    assert g.tokens == 3.0 and g.retry_allowed()


async def test_upstream_dying_mid_stream_is_a_clear_error():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        async def body():
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": "par"}}]}
            yield f"data: {json.dumps(chunk)}\n\n"
            await asyncio.sleep(0.05)
            raise RuntimeError("upstream process died")  # uvicorn drops the connection

        return StreamingResponse(body(), media_type="text/event-stream")

    with ThreadedApp(app) as url:
        be = OpenAIBackend("m", url)
        got = []
        with pytest.raises(BackendUnavailableError, match="stream broke"):
            async for d in be.stream(Q, SamplingParams(max_tokens=4)):
                got.append(d.text)
        await be.aclose()
    assert got == ["par"]  # what arrived is kept; the break is not papered over
    assert be.guard.consecutive_failures == 1


def chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None,
          logprobs: list | None = None) -> str:
    """One SSE event of a chat completion stream, as vLLM's server writes it."""
    choices = [] if content is None and finish is None else [
        {"index": 0, "delta": {"content": content} if content is not None else {},
         "finish_reason": finish, "logprobs": {"content": logprobs} if logprobs else None}]
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": choices, "usage": usage}
    return f"data: {json.dumps(body)}\n\n"


def stream_app(events: list[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        async def body():
            for e in events:
                yield e

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


async def test_a_stream_is_read_whole_text_usage_logprobs_and_finish():
    lp = {"token": "fo", "logprob": -0.5, "bytes": [102, 111],
          "top_logprobs": [{"token": "fo", "logprob": -0.5}, {"token": "x", "logprob": -2.0}]}
    events = [": keep-alive comment\n\n", chunk("fo", logprobs=[lp]),
              chunk("ur", logprobs=[dict(lp, token="ur", logprob=-0.25)]),
              chunk("", finish="length"),
              chunk(usage={"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
                           "prompt_tokens_details": {"cached_tokens": 3}}),
              "data: [DONE]\n\n", chunk("never read")]
    with ThreadedApp(stream_app(events)) as url:
        be = OpenAIBackend("m", url)
        deltas = [d async for d in be.stream(Q, SamplingParams(max_tokens=2, logprobs=True,
                                                               top_logprobs=1))]
        await be.aclose()
    assert [d.text for d in deltas[:-1]] == ["fo", "ur"]
    comp = deltas[-1].completion
    assert (comp.text, comp.finish_reason) == ("four", "length")
    assert (comp.prompt_tokens, comp.completion_tokens, comp.cached_tokens) == (7, 2, 3)
    assert [t.token for t in comp.token_logprobs] == ["fo", "ur"]
    assert comp.logprob == pytest.approx(-0.75)
    # the caller asked for 1 alternative; the wire may carry more
    assert [len(t.top_logprobs) for t in comp.token_logprobs] == [1, 1]


@pytest.mark.parametrize("bad, says", [
    ('data: {"error": {"message": "engine dead", "type": "InternalServerError", '
     '"code": 500}}\n\n', "engine dead"),
    ('data: {"object": "error", "message": "too long", "code": 400}\n\n', "too long"),
    ("data: {not json\n\n", "not a JSON object"),
])
async def test_an_error_event_or_garbage_mid_stream_is_a_clear_error(bad, says):
    with ThreadedApp(stream_app([chunk("par"), bad, chunk("tial")])) as url:
        be = OpenAIBackend("m", url)
        got = []
        with pytest.raises(BackendUnavailableError, match="stream broke") as err:
            async for d in be.stream(Q, SamplingParams(max_tokens=4)):
                got.append(d.text)
        await be.aclose()
    assert got == ["par"] and says in str(err.value)
    assert be.guard.consecutive_failures == 1


async def test_calls_of_one_task_go_to_one_upstream_and_tasks_spread():
    from refinery.engine.run import solve_one
    from refinery.engine.types import Task
    from refinery.strategies import build

    a, b = FaultServer(failures=0), FaultServer(failures=0)
    with a as url_a, b as url_b:
        be = OpenAIBackend("m", [url_a, url_b])
        # critique_refine: a draft, a critique and a refinement per task, three calls
        strategy = build("critique_refine(cot, rounds=1)")
        hits: dict[str, tuple[int, int]] = {}
        for i in range(12):
            before = (len(a.hits), len(b.hits))
            await solve_one(strategy, Task.from_prompt(f"What is {i}+2?", id=f"t{i}"), be)
            hits[f"t{i}"] = (len(a.hits) - before[0], len(b.hits) - before[1])
        await be.aclose()
    assert all(min(h) == 0 and max(h) >= 2 for h in hits.values()), hits  # never split
    assert {h.index(max(h)) for h in hits.values()} == {0, 1}, hits  # both upstreams used
    # the same key always picks the same upstream; no key goes round-robin
    assert be.upstreams.first("t3") == be.upstreams.first("t3")


async def test_a_task_whose_upstream_is_down_moves_to_the_next():
    up = FaultServer(failures=0)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with up as url:
        be = OpenAIBackend("m", [dead, url], config=quick(backoff_max=0.02))
        key = next(k for k in (f"k{i}" for i in range(100)) if be.upstreams.first(k) == 0)
        [c] = await be.generate(Q, SamplingParams(max_tokens=4).but(affinity=key))
        await be.aclose()
    assert c.text == "4" and len(up.hits) == 1
