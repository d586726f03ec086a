"""The model's own thinking on the wire, over a scripted model that thinks (a backend
with a reasoning parser): ``reasoning`` and ``reasoning_content`` on chat messages and
deltas and on completions, the Responses API's reasoning item (``reasoning_text``),
whole and streamed, and ``reasoning_tokens`` counting the thinking and a strategy's steps.
"""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from refinery.serving import ServerConfig
from tests.serving.conftest import (
    ANSWER,
    CHAT,
    COMPLETIONS,
    MODEL,
    PartsBackend,
    chat,
    scripted,
    sse_data,
)

pytestmark = pytest.mark.timeout(60)
THOUGHT = "Two and two make four, so the sum is 4."
T = len(THOUGHT.split())  # the thought's tokens (one a word)
A = len(ANSWER.split())


@pytest.fixture
async def url(scripted_serve, tmp_path) -> str:
    url, _ = await scripted_serve(ServerConfig(store=tmp_path / "store.db"),
                                  backend=PartsBackend(scripted(), THOUGHT))
    return url


def api(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


async def test_a_chat_message_carries_the_thinking_in_both_fields(url, client):
    out = (await client.post(url + CHAT, json=chat())).json()
    message = out["choices"][0]["message"]
    assert message["content"] == ANSWER
    assert message["reasoning"] == message["reasoning_content"] == THOUGHT
    assert out["usage"]["completion_tokens"] == A + T
    assert out["usage"]["completion_tokens_details"] == {"reasoning_tokens": T}


async def test_a_chat_stream_sends_the_thinking_before_the_answer(url, client):
    r = await client.post(url + CHAT, json=chat(stream=True,
                                                stream_options={"include_usage": True}))
    deltas = [d["choices"][0]["delta"] for d in sse_data(r.text)[:-1] if d["choices"]]
    thinking = [d for d in deltas if "reasoning" in d]
    assert all(d["reasoning"] == d["reasoning_content"] for d in thinking)
    assert "".join(d["reasoning"] for d in thinking) == THOUGHT
    answer = [d["content"] for d in deltas if d.get("content")]
    assert "".join(answer) == ANSWER
    first_answer = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all(i < first_answer for i, d in enumerate(deltas) if "reasoning" in d)
    usage = sse_data(r.text)[-2]["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": T}


async def test_under_a_strategy_the_tokens_count_thinking_and_steps(url, client):
    out = (await client.post(url + CHAT, json=chat(model=f"sc(cot, n=3)@{MODEL}"))).json()
    usage = out["usage"]
    # Three samples, each thinking T tokens and answering A: the two not returned are
    # steps (all their tokens), the returned one's thinking is thinking.
    assert usage["completion_tokens"] == 3 * (A + T)
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 2 * (A + T) + T}
    message = out["choices"][0]["message"]
    assert message["content"] == ANSWER and message["reasoning"].startswith(THOUGHT)


async def test_completions_carry_the_thinking_whole_and_streamed(url, client):
    whole = (await client.post(url + COMPLETIONS, json={"model": MODEL,
                                                        "prompt": "2+2?"})).json()
    [choice] = whole["choices"]
    assert (choice["text"], choice["reasoning"], choice["reasoning_content"]) == (
        ANSWER, THOUGHT, THOUGHT)
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": T}
    r = await client.post(url + COMPLETIONS, json={"model": MODEL, "prompt": "2+2?",
                                                   "stream": True})
    choices = [d["choices"][0] for d in sse_data(r.text)[:-1]]
    assert "".join(c.get("reasoning", "") for c in choices) == THOUGHT
    assert "".join(c["text"] for c in choices) == ANSWER


async def test_a_response_has_the_thinking_as_its_reasoning_items_text(url):
    r = await api(url).responses.create(model=MODEL, input="2+2?")
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert message.type == "message" and r.output_text == ANSWER
    assert r.usage.output_tokens_details.reasoning_tokens == T
    # The stored reasoning item is read back as the next turn's input (not replayed).
    again = await api(url).responses.create(model=MODEL, input="and 3+3?",
                                            previous_response_id=r.id)
    assert again.output_text == ANSWER
    listed = await api(url).responses.input_items.list(again.id, order="asc")
    assert [i.type for i in listed.data] == ["message", "reasoning", "message", "message"]


async def test_a_streamed_response_streams_the_thinking_as_reasoning_text(url):
    events = [e async for e in await api(url).responses.create(
        model=MODEL, input="2+2?", stream=True)]
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == THOUGHT
    [done] = [e for e in events if e.type == "response.reasoning_text.done"]
    assert done.text == THOUGHT
    assert kinds.index("response.reasoning_text.done") < kinds.index(
        "response.output_text.delta")
    final = events[-1].response
    assert final.output[0].content[0].text == THOUGHT and final.output_text == ANSWER
    assert final.usage.output_tokens_details.reasoning_tokens == T


async def test_reasoning_text_is_refused_outside_a_reasoning_item(url, client):
    part = {"type": "reasoning_text", "text": THOUGHT}
    r = await client.post(url + "/v1/responses", json={"model": MODEL, "input": [
        {"type": "message", "role": "user", "content": [part]}]})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("input")
    sent_back = await client.post(url + "/v1/responses", json={"model": MODEL, "input": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [part]},
        {"type": "message", "role": "user", "content": "2+2?"}]})
    assert sent_back.status_code == 200, sent_back.text
