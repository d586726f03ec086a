"""What a response continues and what it leaves behind: stored turns and conversations.

A Responses request may continue earlier turns: ``previous_response_id`` (a
stored response: the items it read, then the items it answered, whatever the
length of its chain) or ``conversation`` (a conversation's items); OpenAI
refuses both at once, and so does this. Instructions are the request's own: an
earlier response's do not carry over, as OpenAI documents. When the response
is done, :meth:`Thread.keep` stores it (unless ``store: false``) and appends the
request's input and the response's output to its conversation. Stored items
carry ids (``msg_``, ``fc_``, ``fco_``, ``rs_``), and text content is a list of
parts, as OpenAI lists items.

Example:
    >>> thread = Thread.of(ResponsesRequest(model="m", input="hi"), store=None, scope="")
    >>> thread.prior, thread.stores, [i.content[0].text for i in thread.items]
    ([], False, ['hi'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from refinery.engine.errors import InvalidRequestError, NotFoundError
from refinery.serving.responses_protocol import (
    ConversationRef,
    InputContent,
    InputItem,
    ItemList,
    ResponseObject,
    ResponsesRequest,
)
from refinery.serving.responses_stream import item_id
from refinery.serving.store import ResponseStore, StoredResponse

__all__ = ["Thread", "found", "page", "stored_items", "the_store"]

T = TypeVar("T")
ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
               "reasoning": "rs"}


def the_store(store: ResponseStore | None, param: str | None = None) -> ResponseStore:
    """``store``, or the error a request that needs one gets on a server without it."""
    if store is None:
        raise InvalidRequestError("this server keeps no responses or conversations (it "
                                  "runs without a store): send the whole conversation in "
                                  "input", param=param)
    return store


def found(value: T | None, kind: str, id: str, param: str | None = None) -> T:
    """``value``, or (None: nothing stored under ``id``) the 404 OpenAI answers.

    Raises:
        NotFoundError: ``"Response with id 'resp_...' not found."``
    """
    if value is None:
        raise NotFoundError(f"{kind} with id {id!r} not found.", param=param)
    return value


def stored_items(items: list[InputItem] | str) -> list[InputItem]:
    """Items as stored and listed: each with an id, message text as content parts
    (``input_text``; an assistant's ``output_text``)."""
    if isinstance(items, str):
        items = [InputItem(role="user", content=items)]
    out = []
    for item in items:
        update: dict = {}
        if item.id is None:
            update["id"] = item_id(ID_PREFIXES.get(item.type, "item"))
        if item.type == "message" and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            update["content"] = [InputContent(type=kind, text=item.content)]
        out.append(item.model_copy(update=update))
    return out


def as_items(response: ResponseObject) -> list[InputItem]:
    """A response's output items as input items (what a next turn reads)."""
    return [InputItem.model_validate(o.model_dump(mode="json")) for o in response.output]


@dataclass
class Thread:
    """One Responses request's place among stored turns: the items it continues
    (``prior``), its own input as items (``own``), and where its response is kept."""

    store: ResponseStore | None
    scope: str  # whose rows these are (serving.dependencies.caller_scope)
    prior: list[InputItem]
    own: list[InputItem]
    stores: bool  # the response is stored (the store exists, the request did not refuse)
    conversation: str | None = None

    @classmethod
    def of(cls, req: ResponsesRequest, store: ResponseStore | None, scope: str) -> Thread:
        """The thread of ``req``, its earlier items read from ``store``.

        Raises:
            InvalidRequestError: both ``previous_response_id`` and ``conversation``, an
                unknown previous response, or either on a server without a store.
            NotFoundError: an unknown conversation.
        """
        conv = req.conversation
        conv_id = conv.id if isinstance(conv, ConversationRef) else conv
        prior: list[InputItem] = []
        if req.previous_response_id is not None and conv_id is not None:
            raise InvalidRequestError("previous_response_id and conversation cannot be used "
                                      "together: send one of them", param="conversation")
        if req.previous_response_id is not None:
            prev = the_store(store, "previous_response_id").response(
                req.previous_response_id, scope)
            if prev is None:
                raise InvalidRequestError(
                    f"Previous response with id {req.previous_response_id!r} not found.",
                    param="previous_response_id", code="previous_response_not_found")
            prior = prev.context + prev.output
        elif conv_id is not None:
            prior = found(the_store(store, "conversation").conversation_items(conv_id, scope),
                          "Conversation", conv_id, param="conversation")
        return cls(store, scope, prior, stored_items(req.input),
                   stores=store is not None and req.store is not False, conversation=conv_id)

    @property
    def items(self) -> list[InputItem]:
        """Everything the model reads: the earlier items, then this request's."""
        return self.prior + self.own

    def keep(self, response: ResponseObject) -> None:
        """Store a finished response (if it is to be) and extend its conversation."""
        if self.store is None:
            return
        output = as_items(response)
        if self.stores:
            self.store.put_response(self.scope, StoredResponse(
                response.id, self.items, output, response))
        if self.conversation is not None:
            self.store.append_items(self.conversation, self.scope, self.own + output)


def page(items: list[InputItem], limit: int = 20, order: str = "desc",
         after: str | None = None) -> ItemList:
    """One page of ``items`` (oldest first), as OpenAI's item lists page: ``order``
    ``desc`` (newest first, the default) or ``asc``, from the item after ``after``.

    Example:
        >>> items = stored_items([InputItem(id=f"msg_{k}", role="user", content="x")
        ...                       for k in range(3)])
        >>> p = page(items, limit=1, order="asc", after="msg_0")
        >>> p.first_id, p.has_more
        ('msg_1', True)

    Raises:
        InvalidRequestError: ``after`` names no item of the list.
    """
    seq = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [i.id for i in seq]
        if after not in ids:
            raise InvalidRequestError(f"after names no item of this list: {after!r}",
                                      param="after")
        seq = seq[ids.index(after) + 1:]
    data = seq[:limit]
    return ItemList(data=data, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None, has_more=len(seq) > limit)
