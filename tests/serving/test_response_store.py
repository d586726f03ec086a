"""Stored responses and conversations through the official client on a real uvicorn
over the scripted backend: retrieval by id within the writer's key, chains of
``previous_response_id``, ``store: false``, conversations that grow with each turn,
and the errors OpenAI answers for unknown or conflicting continuations."""

from __future__ import annotations

import openai
import pytest
from openai import AsyncOpenAI

from refinery.serving import ServerConfig
from tests.serving.conftest import ANSWER, MODEL, scripted

pytestmark = pytest.mark.timeout(60)
KEYS = frozenset({"key-a", "key-b"})


@pytest.fixture
async def served(scripted_serve, tmp_path):
    """``(client_of(key), backend)`` over a server with two keys and its own store."""
    backend = scripted()
    url, _ = await scripted_serve(ServerConfig(api_keys=KEYS, store=tmp_path / "store.db"),
                                  backend=backend)

    def client_of(key: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    return client_of, backend


def turns(call) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in call.messages]


async def test_a_stored_response_is_read_and_deleted_by_its_key_only(served):
    client_of, _ = served
    a, b = client_of("key-a"), client_of("key-b")
    r = await a.responses.create(model=MODEL, input="2+2?", metadata={"run": "1"})
    assert r.store is True
    got = await a.responses.retrieve(r.id)
    assert (got.id, got.output_text, got.metadata) == (r.id, ANSWER, {"run": "1"})
    items = await a.responses.input_items.list(r.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [
        ("message", "user", "2+2?")]
    with pytest.raises(openai.NotFoundError) as other:
        await b.responses.retrieve(r.id)
    assert other.value.body["message"] == f"Response with id '{r.id}' not found."
    with pytest.raises(openai.BadRequestError) as cont:
        await b.responses.create(model=MODEL, input="and?", previous_response_id=r.id)
    assert {k: cont.value.body[k] for k in ("type", "param", "code")} == {
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}
    with pytest.raises(openai.NotFoundError):
        await b.responses.delete(r.id)
    await a.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        await a.responses.retrieve(r.id)


async def test_a_chain_of_three_turns_keeps_its_context_but_not_instructions(served):
    client_of, backend = served
    api = client_of("key-a")
    r1 = await api.responses.create(model=MODEL, input="My name is Ada.",
                                    instructions="Be brief.")
    stream = await api.responses.create(model=MODEL, input="What is my name?",
                                        previous_response_id=r1.id,
                                        instructions="Answer in French.", stream=True)
    r2 = [ev async for ev in stream][-1].response  # a streamed turn is stored too
    r3 = await api.responses.create(model=MODEL, input="Once more?",
                                    previous_response_id=r2.id)
    assert (r2.previous_response_id, r3.previous_response_id) == (r1.id, r2.id)
    assert turns(backend.calls[1]) == [
        ("system", "Answer in French."), ("user", "My name is Ada."), ("assistant", ANSWER),
        ("user", "What is my name?")]
    assert turns(backend.calls[2]) == [
        ("user", "My name is Ada."), ("assistant", ANSWER), ("user", "What is my name?"),
        ("assistant", ANSWER), ("user", "Once more?")]
    listed = await api.responses.input_items.list(r3.id, order="asc", limit=2)
    assert [i.role for i in listed.data] == ["user", "assistant"] and listed.has_more


async def test_store_false_is_answered_and_not_kept(served):
    client_of, _ = served
    api = client_of("key-a")
    r = await api.responses.create(model=MODEL, input="2+2?", store=False)
    assert r.store is False and r.output_text == ANSWER
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as cont:
        await api.responses.create(model=MODEL, input="and?", previous_response_id=r.id)
    assert cont.value.body["message"] == f"Previous response with id '{r.id}' not found."


async def test_a_conversation_is_read_and_extended_by_each_response(served):
    client_of, backend = served
    api = client_of("key-a")
    conv = await api.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}],
        metadata={"topic": "names"})
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "names"}
    r = await api.responses.create(model=MODEL, input="What is my name?",
                                   conversation=conv.id)
    assert r.conversation.id == conv.id
    await api.responses.create(model=MODEL, input="Again?", conversation={"id": conv.id})
    assert turns(backend.calls[1]) == [
        ("user", "My name is Ada."), ("user", "What is my name?"), ("assistant", ANSWER),
        ("user", "Again?")]
    items = await api.conversations.items.list(conv.id, order="asc")
    assert [(i.role, i.content[0].text) for i in items.data] == [
        ("user", "My name is Ada."), ("user", "What is my name?"), ("assistant", ANSWER),
        ("user", "Again?"), ("assistant", ANSWER)]
    assert all(i.id for i in items.data) and not items.has_more
    added = await api.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "Bye."}])
    assert [i.content[0].text for i in added.data] == ["Bye."]
    newest = await api.conversations.items.list(conv.id, limit=1)
    assert newest.data[0].id == added.data[0].id and newest.has_more
    with pytest.raises(openai.NotFoundError):
        await client_of("key-b").conversations.retrieve(conv.id)
    assert (await api.conversations.delete(conv.id)).deleted is True
    with pytest.raises(openai.NotFoundError) as gone:
        await api.responses.create(model=MODEL, input="hi", conversation=conv.id)
    assert gone.value.body["param"] == "conversation"
    assert gone.value.body["message"] == f"Conversation with id '{conv.id}' not found."


async def test_previous_response_id_and_conversation_together_are_refused(served):
    client_of, backend = served
    api = client_of("key-a")
    r = await api.responses.create(model=MODEL, input="2+2?")
    conv = await api.conversations.create()
    with pytest.raises(openai.BadRequestError) as both:
        await api.responses.create(model=MODEL, input="and?", previous_response_id=r.id,
                                   conversation=conv.id)
    assert both.value.body["param"] == "conversation"
    assert len(backend.calls) == 1


async def test_without_a_store_continuations_are_refused(scripted_serve):
    url, _ = await scripted_serve(ServerConfig(store=None))
    api = AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
    r = await api.responses.create(model=MODEL, input="2+2?")
    assert r.store is False
    with pytest.raises(openai.BadRequestError) as cont:
        await api.responses.create(model=MODEL, input="and?", previous_response_id=r.id)
    assert cont.value.body["param"] == "previous_response_id"
    assert "runs without a store" in cont.value.body["message"]


async def test_a_conversation_item_is_read_and_popped_and_its_metadata_replaced(served):
    client_of, _ = served
    api = client_of("key-a")
    conv = await api.conversations.create(items=[
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "user", "content": "second"}])
    [newest] = (await api.conversations.items.list(conv.id, limit=1)).data
    assert (await api.conversations.items.retrieve(newest.id, conversation_id=conv.id)
            ).content[0].text == "second"
    after = await api.conversations.items.delete(newest.id, conversation_id=conv.id)
    assert after.id == conv.id  # OpenAI answers the conversation
    left = await api.conversations.items.list(conv.id)
    assert [i.content[0].text for i in left.data] == ["first"]
    with pytest.raises(openai.NotFoundError) as gone:
        await api.conversations.items.delete(newest.id, conversation_id=conv.id)
    assert gone.value.body["message"] == f"Item with id '{newest.id}' not found."
    updated = await api.conversations.update(conv.id, metadata={"topic": "t"})
    assert updated.metadata == {"topic": "t"}
    assert (await api.conversations.retrieve(conv.id)).metadata == {"topic": "t"}
