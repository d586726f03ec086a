"""Two ``refinery serve`` replicas over one pool of two upstreams, all real.

The upstreams are two real uvicorn servers answering in passthrough from the
session's real engine; each notes the prompts it was sent. The replicas are
``refinery serve --backend openai --base-url A --base-url B`` subprocesses,
and the official ``openai`` client spreads requests over them as a load
balancer would. Every request is answered; all calls of one request went to
the one upstream its id picks (its prefix cache), none to the other; with one
replica killed the other answers the same conversation, since no state lives
in a replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import openai
import pytest

from refinery.engine.backends.openai import upstream_for
from refinery.engine.types import Message
from refinery.serving import ServerConfig, create_app
from tests.servers import LoopServers
from tests.serving.test_faults import MODEL, refinery_serve

pytestmark = pytest.mark.e2e

SPEC = f"critique_refine(cot, rounds=1)@{MODEL}"  # three calls a request


class Noting:
    """The real backend, noting the prompts of every call sent to it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompts: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _note(self, messages: Sequence[Message]) -> None:
        self.prompts.append("\n".join(m.content for m in messages))

    async def generate(self, messages, params, **kw):
        self._note(messages)
        return await self.inner.generate(messages, params, **kw)

    def stream(self, messages, params, **kw):
        self._note(messages)
        return self.inner.stream(messages, params, **kw)


async def test_two_replicas_share_an_upstream_pool_and_keep_a_request_together(
        tmp_path, vllm_backend):
    pool = [Noting(vllm_backend), Noting(vllm_backend)]
    upstreams = LoopServers()
    urls = [await upstreams.start(create_app(ServerConfig(), backend=b)) + "/v1" for b in pool]
    replicas = [refinery_serve(tmp_path, "--backend", "openai", "--base-url", urls[0],
                               "--base-url", urls[1]) for _ in range(2)]
    try:
        # /health probes the upstreams, served by this event loop: wait off the loop
        await asyncio.gather(*(asyncio.to_thread(r.wait_ready, 120) for r in replicas))
        clients = [openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="x", max_retries=0)
                   for r in replicas]
        questions = [f"What is {i} plus {i + 3}?" for i in range(10)]
        answers = await asyncio.gather(*(
            clients[i % 2].chat.completions.create(
                model=SPEC, messages=[{"role": "user", "content": q}], max_tokens=32,
                temperature=0.7)
            for i, q in enumerate(questions)))
        assert all(a.usage.completion_tokens > 0 and a.choices[0].finish_reason
                   in ("stop", "length") for a in answers), answers
        # A request's calls carry its id as their affinity, so its upstream is known
        # in advance: all of them go there, none to the other. (Which upstreams serve
        # is the ids' luck: 10 random ids all land on one 2 times in 1,024.)
        chosen = [upstream_for(a.id, len(pool)) for a in answers]
        for q, up in zip(questions, chosen, strict=True):
            calls = [sum(q in p for p in b.prompts) for b in pool]
            assert calls[up] >= 2 and calls[1 - up] == 0, (q, up, calls)
        assert [bool(b.prompts) for b in pool] == [i in chosen for i in range(len(pool))]

        replicas[0].stop()  # nothing of a conversation lives in a replica
        history = [{"role": "user", "content": questions[0]},
                   {"role": "assistant", "content": answers[0].choices[0].message.content},
                   {"role": "user", "content": "And that number times two?"}]
        follow = await clients[1].chat.completions.create(model=SPEC, messages=history,
                                                          max_tokens=32)
        assert follow.usage.completion_tokens > 0
    finally:
        for r in replicas:
            r.stop()
        await upstreams.stop()
