"""The SQLite response store on its own: rows expire with the injected clock, stay in
their scope, survive a reopen of the file, and conversations keep their order."""

from __future__ import annotations

from refinery.serving.responses_protocol import InputItem, ResponseObject
from refinery.serving.store import ResponseStore, StoredResponse

TTL = 100.0


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def row(id: str = "resp_1") -> StoredResponse:
    said = InputItem(id="msg_1", role="user", content="2+2?")
    answered = InputItem(id="msg_2", role="assistant", content="4")
    return StoredResponse(id, [said], [answered],
                          ResponseObject(id=id, created_at=1, model="m", store=True))


def test_a_response_expires_after_its_ttl(tmp_path):
    clock = Clock()
    store = ResponseStore(tmp_path / "s.db", TTL, clock=clock)
    store.put_response("", row())
    clock.now += TTL - 1
    kept = store.response("resp_1", "")
    assert kept is not None and [i.content for i in kept.context + kept.output] == ["2+2?", "4"]
    assert kept.response.store is True
    clock.now += 1
    assert store.response("resp_1", "") is None
    assert store.delete_response("resp_1", "") is False


def test_rows_stay_in_their_scope_and_in_the_file(tmp_path):
    store = ResponseStore(tmp_path / "s.db", TTL)
    store.put_response("scope-a", row())
    conv = store.create_conversation("scope-a", {}, [])
    again = ResponseStore(tmp_path / "s.db", TTL)  # another server on the same file
    assert again.response("resp_1", "scope-b") is None
    assert again.response("resp_1", "scope-a") is not None
    assert again.append_items(conv.id, "scope-b", row().context) is False
    assert again.delete_conversation(conv.id, "scope-b") is False
    assert again.conversation(conv.id, "scope-a") == conv


def test_a_conversation_keeps_its_order_and_lives_on_from_its_last_write(tmp_path):
    clock = Clock()
    store = ResponseStore(tmp_path / "s.db", TTL, clock=clock)
    first = [InputItem(id=f"msg_{k}", role="user", content=str(k)) for k in range(2)]
    conv = store.create_conversation("", {"topic": "t"}, first)
    clock.now += TTL - 1
    assert store.append_items(conv.id, "", [InputItem(id="msg_2", role="user", content="2")])
    clock.now += TTL - 1  # past the creation's TTL, within the append's
    assert [i.content for i in store.conversation_items(conv.id, "")] == ["0", "1", "2"]
    clock.now += 1
    assert store.conversation_items(conv.id, "") is None
    assert store.append_items(conv.id, "", first) is False
