"""The HTTP routes: thin, each one a call into the serve path or the state.

Example:
    >>> app.include_router(router)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from refinery.engine.errors import BackendUnavailableError, RefineryError
from refinery.serving.conversations import Thread, found, page, stored_items, the_store
from refinery.serving.dependencies import Scope, State, admit, authorize
from refinery.serving.endpoints import COMPLETION
from refinery.serving.errors import error_response, renamed
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from refinery.serving.responses import PARAMS, ResponsesEndpoint, chat_request, input_messages
from refinery.serving.responses_protocol import (
    ConversationObject,
    ConversationRequest,
    ConversationUpdate,
    Deleted,
    InputItem,
    ItemList,
    ItemsRequest,
    ResponseObject,
    ResponsesRequest,
)
from refinery.serving.serve import serve
from refinery.serving.tool_forms import LEGACY_PARAMS, endpoint_for, plain_tools
from refinery.strategies import build_with_graph
from refinery.strategies.spec import worst_case_calls

# What the OpenAPI schema documents (and Schemathesis checks answers against): every
# error is the OpenAI error body, never FastAPI's default 422 shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused (OpenAI error schema)."},
    "5XX": {"model": ErrorResponse, "description": "Failed (OpenAI error schema)."}}
SSE = {"text/event-stream": {"schema": {  # one server-sent event: data is a JSON chunk
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}}}
COMPLETIONS = [Depends(authorize), Depends(admit)]
AUTHORIZED = [Depends(authorize)]
# An item list's paging, as OpenAI's: newest first unless order=asc, from after an id.
Limit = Annotated[int, Query(ge=1, le=100)]
Order = Literal["asc", "desc"]

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=COMPLETIONS, responses={
    200: {"model": ChatCompletionResponse, "content": SSE}, **ERRORS})
async def chat_completions(req: ChatCompletionRequest, request: Request,
                           state: State) -> Response:
    """Chat; allowed tools and legacy functions served as the plain tools they mean
    (serving/tool_forms.py), answered in the form asked."""
    try:
        return await serve(request, plain_tools(req), endpoint_for(req), state)
    except RefineryError as exc:
        raise (renamed(exc, LEGACY_PARAMS) if req.functions is not None else exc) from None


@router.post("/v1/completions", dependencies=COMPLETIONS, responses={
    200: {"model": CompletionResponse, "content": SSE}, **ERRORS})
async def completions(req: CompletionRequest, request: Request, state: State) -> Response:
    return await serve(request, req, COMPLETION, state)


@router.post("/v1/responses", dependencies=COMPLETIONS, responses={
    200: {"model": ResponseObject, "content": SSE}, **ERRORS})
async def responses(req: ResponsesRequest, request: Request, state: State,
                    scope: Scope) -> Response:
    """The Responses API on the chat serve path (serving/responses.py), after the
    turns it continues (serving/conversations.py)."""
    try:
        thread = Thread.of(req, state.store, scope)
        return await serve(request, chat_request(req, thread.items),
                           ResponsesEndpoint(req, thread), state)
    except RefineryError as exc:
        raise renamed(exc, PARAMS) from None


@router.get("/v1/responses/{response_id}", dependencies=AUTHORIZED, responses=ERRORS,
            response_model_exclude_none=True)
async def stored_response(response_id: str, state: State, scope: Scope) -> ResponseObject:
    return found(the_store(state.store).response(response_id, scope), "Response",
                 response_id).response


@router.get("/v1/responses/{response_id}/input_items", dependencies=AUTHORIZED,
            responses=ERRORS, response_model_exclude_none=True)
async def response_input_items(response_id: str, state: State, scope: Scope,
                               limit: Limit = 20, order: Order = "desc",
                               after: str | None = None) -> ItemList:
    """The items the response read: the turns it continued, then its own input."""
    stored = found(the_store(state.store).response(response_id, scope), "Response",
                   response_id)
    return page(stored.context, limit, order, after)


@router.delete("/v1/responses/{response_id}", dependencies=AUTHORIZED, responses=ERRORS)
async def delete_response(response_id: str, state: State, scope: Scope) -> Deleted:
    found(the_store(state.store).delete_response(response_id, scope) or None, "Response",
          response_id)
    return Deleted(id=response_id, object="response")


@router.post("/v1/conversations", dependencies=AUTHORIZED, responses=ERRORS)
async def create_conversation(req: ConversationRequest, state: State,
                              scope: Scope) -> ConversationObject:
    items = stored_items(req.items or [])
    input_messages(items, param="items")  # an item no turn could read is refused now
    return the_store(state.store).create_conversation(scope, req.metadata or {}, items)


@router.get("/v1/conversations/{conversation_id}", dependencies=AUTHORIZED, responses=ERRORS)
async def conversation(conversation_id: str, state: State, scope: Scope) -> ConversationObject:
    return found(the_store(state.store).conversation(conversation_id, scope), "Conversation",
                 conversation_id)


@router.post("/v1/conversations/{conversation_id}", dependencies=AUTHORIZED, responses=ERRORS)
async def update_conversation(conversation_id: str, req: ConversationUpdate, state: State,
                              scope: Scope) -> ConversationObject:
    return found(the_store(state.store).update_conversation(conversation_id, scope,
                                                            req.metadata), "Conversation",
                 conversation_id)


@router.delete("/v1/conversations/{conversation_id}", dependencies=AUTHORIZED,
               responses=ERRORS)
async def delete_conversation(conversation_id: str, state: State, scope: Scope) -> Deleted:
    found(the_store(state.store).delete_conversation(conversation_id, scope) or None,
          "Conversation", conversation_id)
    return Deleted(id=conversation_id, object="conversation.deleted")


@router.get("/v1/conversations/{conversation_id}/items", dependencies=AUTHORIZED,
            responses=ERRORS, response_model_exclude_none=True)
async def conversation_items(conversation_id: str, state: State, scope: Scope,
                             limit: Limit = 20, order: Order = "desc",
                             after: str | None = None) -> ItemList:
    items = the_store(state.store).conversation_items(conversation_id, scope)
    return page(found(items, "Conversation", conversation_id), limit, order, after)


@router.post("/v1/conversations/{conversation_id}/items", dependencies=AUTHORIZED,
             responses=ERRORS, response_model_exclude_none=True)
async def add_conversation_items(conversation_id: str, req: ItemsRequest, state: State,
                                 scope: Scope) -> ItemList:
    """Append items; the answer lists the added items, as stored (with their ids)."""
    items = stored_items(req.items)
    input_messages(items, param="items")
    found(the_store(state.store).append_items(conversation_id, scope, items) or None,
          "Conversation", conversation_id)
    return page(items, limit=len(items), order="asc")


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", dependencies=AUTHORIZED,
            responses=ERRORS, response_model_exclude_none=True)
async def conversation_item(conversation_id: str, item_id: str, state: State,
                            scope: Scope) -> InputItem:
    items = found(the_store(state.store).conversation_items(conversation_id, scope),
                  "Conversation", conversation_id)
    return found(next((i for i in items if i.id == item_id), None), "Item", item_id)


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", dependencies=AUTHORIZED,
               responses=ERRORS)
async def delete_conversation_item(conversation_id: str, item_id: str, state: State,
                                   scope: Scope) -> ConversationObject:
    """Delete one item; the answer is the conversation, as OpenAI's."""
    store = the_store(state.store)
    found(store.delete_item(conversation_id, scope, item_id) or None, "Item", item_id)
    return found(store.conversation(conversation_id, scope), "Conversation", conversation_id)


@router.get("/v1/models", dependencies=[Depends(authorize)], responses=ERRORS)
async def models(state: State) -> ModelList:
    """The served model (passthrough) and every preset, with its worst-case calls."""
    served = state.config.model
    cards = [ModelCard(id=served, reasoning_effort={
        level: e.spec for level, e in state.config.effort.items()})]
    for name, spec in state.config.presets.items():
        _, graph = build_with_graph(spec, max_calls=None)
        cards.append(ModelCard(id=f"{name}@{served}", strategy=spec,
                               worst_case_calls=worst_case_calls(graph)))
    return ModelList(data=cards)


@router.get("/health", response_class=Response, responses={
    200: {"description": "Ready (empty body)."}, **ERRORS})
async def health(state: State) -> Response:
    """200 when the engine can serve; otherwise 503 saying why (starting, died...)."""
    service = state.service
    if service.backend is not None:
        await service.backend.check_health()  # e.g. is the upstream reachable now?
    if service.ready:
        return Response(status_code=200)
    return error_response(BackendUnavailableError(f"not ready: {service.not_ready_reason}"))


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text.", "content": {"text/plain": {}}}})
async def prometheus(state: State) -> Response:
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

