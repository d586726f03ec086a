"""The HTTP routes: thin, each one a call into the serve path or the state.

Example:
    >>> app.include_router(router)
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from refinery.engine.errors import BackendUnavailableError, NotFoundError, RefineryError
from refinery.strategies.spec import worst_case_calls
from refinery.serving.dependencies import State, admit, authorize
from refinery.serving.endpoints import CHAT, COMPLETION
from refinery.serving.errors import error_response
from refinery.serving.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from refinery.serving.responses import ResponsesEndpoint, chat_request, renamed
from refinery.serving.responses_protocol import ResponseObject, ResponsesRequest
from refinery.serving.serve import serve
from refinery.strategies import build_with_graph

# What the OpenAPI schema documents (and Schemathesis checks answers against): every
# error is the OpenAI error body, never FastAPI's default 422 shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused (OpenAI error schema)."},
    "5XX": {"model": ErrorResponse, "description": "Failed (OpenAI error schema)."}}
SSE = {"text/event-stream": {"schema": {  # one server-sent event: data is a JSON chunk
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}}}
COMPLETIONS = [Depends(authorize), Depends(admit)]

router = APIRouter()


@router.post("/v1/chat/completions", dependencies=COMPLETIONS, responses={
    200: {"model": ChatCompletionResponse, "content": SSE}, **ERRORS})
async def chat_completions(req: ChatCompletionRequest, request: Request,
                           state: State) -> Response:
    return await serve(request, req, CHAT, state)


@router.post("/v1/completions", dependencies=COMPLETIONS, responses={
    200: {"model": CompletionResponse, "content": SSE}, **ERRORS})
async def completions(req: CompletionRequest, request: Request, state: State) -> Response:
    return await serve(request, req, COMPLETION, state)


@router.post("/v1/responses", dependencies=COMPLETIONS, responses={
    200: {"model": ResponseObject, "content": SSE}, **ERRORS})
async def responses(req: ResponsesRequest, request: Request, state: State) -> Response:
    """The Responses API on the chat serve path (serving/responses.py)."""
    try:
        return await serve(request, chat_request(req), ResponsesEndpoint(req), state)
    except RefineryError as exc:
        raise renamed(exc) from None


@router.get("/v1/responses/{response_id}", dependencies=[Depends(authorize)],
            responses=ERRORS)
async def stored_response(response_id: str) -> Response:
    raise NotFoundError(f"response {response_id!r} was not stored: this server stores no "
                        "responses", param="response_id")


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
