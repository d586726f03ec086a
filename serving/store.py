"""The response store: stored Responses and conversations, in one SQLite file.

A stored response keeps what it read (``context``: the earlier turns' items,
then its own input) and what it answered, so a request that continues it
(``previous_response_id``) reads one row however long the chain is, and a
response still continues after an earlier one in its chain expired or was
deleted. A conversation is an ordered list of items. Every row belongs to a
``scope`` (the digest of the API key that wrote it, ``""`` on a server without
keys) and is read, listed and deleted only in that scope; rows expire
``ttl_seconds`` after they were written (a conversation: after its last write).

Example:
    >>> store = ResponseStore(":memory:", ttl_seconds=60)
    >>> conv = store.create_conversation("", {"topic": "sums"}, [InputItem(id="msg_1",
    ...     role="user", content="2+2?")])
    >>> [i.content for i in store.conversation_items(conv.id, "")]
    ['2+2?']
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from refinery.engine.errors import StorageError
from refinery.serving.responses_protocol import ConversationObject, InputItem, ResponseObject

__all__ = ["ResponseStore", "StoredResponse"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, expires REAL NOT NULL,
    context TEXT NOT NULL, output TEXT NOT NULL, response TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, expires REAL NOT NULL,
    created_at INTEGER NOT NULL, metadata TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversation_items (
    conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    seq INTEGER NOT NULL, item TEXT NOT NULL, PRIMARY KEY (conversation, seq));
CREATE INDEX IF NOT EXISTS responses_expiry ON responses(expires);
CREATE INDEX IF NOT EXISTS conversations_expiry ON conversations(expires);
"""


@dataclass(frozen=True)
class StoredResponse:
    """A stored response: the items it read, the items it answered, the whole object."""

    id: str
    context: list[InputItem]
    output: list[InputItem]
    response: ResponseObject


def dumped(items: list[InputItem]) -> str:
    return json.dumps([i.model_dump(mode="json", exclude_none=True) for i in items])


def loaded(text: str) -> list[InputItem]:
    return [InputItem.model_validate(i) for i in json.loads(text)]


class ResponseStore:
    """Stored responses and conversations in the SQLite file ``path`` (``:memory:``
    for one that lives as long as the object), opened on first use.

    ``clock`` gives the time in seconds (tests pass their own to expire rows).
    One connection, used under a lock: each operation is a few rows.
    """

    def __init__(self, path: str | Path, ttl_seconds: float,
                 clock: Callable[[], float] = time.time):
        self.path, self.ttl, self.clock = str(path), ttl_seconds, clock
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _run(self, sql: str, args: tuple = (), *, many: bool = False) -> list[tuple]:
        """Run one statement in one transaction (``many``: once per row of ``args``)."""
        with self._lock:
            try:
                db = self._connect()
                with db:  # one transaction
                    cur = db.executemany(sql, args) if many else db.execute(sql, args)
                    return cur.fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"response store {self.path}: {exc}") from exc

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            db.execute("PRAGMA foreign_keys = ON")
            if self.path != ":memory:":
                db.execute("PRAGMA journal_mode = WAL")  # readers do not wait on a writer
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    def _expiry(self) -> float:
        return self.clock() + self.ttl

    def purge(self) -> None:
        """Drop every expired row (done on each write, so the file stays bounded; the
        expiry is indexed, so this reads only the rows it drops)."""
        now = self.clock()
        self._run("DELETE FROM responses WHERE expires <= ?", (now,))
        self._run("DELETE FROM conversations WHERE expires <= ?", (now,))

    # -- responses ----------------------------------------------------------------------

    def put_response(self, scope: str, row: StoredResponse) -> None:
        self.purge()
        self._run("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)", (
            row.id, scope, self._expiry(), dumped(row.context), dumped(row.output),
            row.response.model_dump_json(exclude_none=True)))

    def response(self, id: str, scope: str) -> StoredResponse | None:
        """The stored response ``id`` of ``scope`` (None: unknown, expired, another's)."""
        rows = self._run("SELECT context, output, response FROM responses "
                         "WHERE id = ? AND scope = ? AND expires > ?", (id, scope, self.clock()))
        if not rows:
            return None
        context, output, response = rows[0]
        return StoredResponse(id, loaded(context), loaded(output),
                              ResponseObject.model_validate_json(response))

    def delete_response(self, id: str, scope: str) -> bool:
        """Delete a stored response; False if there was none to delete."""
        return bool(self._run("DELETE FROM responses WHERE id = ? AND scope = ? "
                              "AND expires > ? RETURNING id", (id, scope, self.clock())))

    # -- conversations ------------------------------------------------------------------

    def create_conversation(self, scope: str, metadata: dict[str, str],
                            items: list[InputItem]) -> ConversationObject:
        self.purge()
        conv = ConversationObject(id=f"conv_{uuid.uuid4().hex}", created_at=int(self.clock()),
                                  metadata=metadata)
        self._run("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)", (
            conv.id, scope, self._expiry(), conv.created_at, json.dumps(metadata)))
        self.append_items(conv.id, scope, items)
        return conv

    def conversation(self, id: str, scope: str) -> ConversationObject | None:
        rows = self._run("SELECT created_at, metadata FROM conversations "
                         "WHERE id = ? AND scope = ? AND expires > ?", (id, scope, self.clock()))
        return ConversationObject(id=id, created_at=rows[0][0],
                                  metadata=json.loads(rows[0][1])) if rows else None

    def conversation_items(self, id: str, scope: str) -> list[InputItem] | None:
        """The items of a conversation, oldest first (None: no such conversation)."""
        if self.conversation(id, scope) is None:
            return None
        rows = self._run("SELECT item FROM conversation_items WHERE conversation = ? "
                         "ORDER BY seq", (id,))
        return [InputItem.model_validate_json(r[0]) for r in rows]

    def append_items(self, id: str, scope: str, items: list[InputItem]) -> bool:
        """Append ``items`` to a conversation (which lives on ``ttl`` from now); False if
        there is no such conversation."""
        if not self._run("UPDATE conversations SET expires = ? WHERE id = ? AND scope = ? "
                         "AND expires > ? RETURNING id",
                         (self._expiry(), id, scope, self.clock())):
            return False
        # The next place is taken inside the insert: one transaction, so two servers
        # on one file never write the same place.
        self._run("INSERT INTO conversation_items SELECT ?, COALESCE(MAX(seq), -1) + 1, ? "
                  "FROM conversation_items WHERE conversation = ?", [
                      (id, item.model_dump_json(exclude_none=True), id) for item in items],
                  many=True)
        return True

    def update_conversation(self, id: str, scope: str,
                            metadata: dict[str, str]) -> ConversationObject | None:
        """Replace a conversation's metadata (None: no such conversation)."""
        if not self._run("UPDATE conversations SET metadata = ? WHERE id = ? AND scope = ? "
                         "AND expires > ? RETURNING id",
                         (json.dumps(metadata), id, scope, self.clock())):
            return None
        return self.conversation(id, scope)

    def delete_item(self, id: str, scope: str, item_id: str) -> bool:
        """Delete one item of a conversation; False if there is no such item."""
        if self.conversation(id, scope) is None:
            return False
        return bool(self._run("DELETE FROM conversation_items WHERE conversation = ? AND "
                              "json_extract(item, '$.id') = ? RETURNING seq", (id, item_id)))

    def delete_conversation(self, id: str, scope: str) -> bool:
        return bool(self._run("DELETE FROM conversations WHERE id = ? AND scope = ? "
                              "AND expires > ? RETURNING id", (id, scope, self.clock())))
