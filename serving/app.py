"""The FastAPI app: thin routes over ``Service``; errors in the OpenAI schema.

Example:
    >>> app = create_app(ServerConfig(), backend_factory=lambda: VLLMBackend.create())
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from refinery.engine.backends.base import Backend
from refinery.engine.errors import AuthenticationError, OverCapacityError, RefineryError
from refinery.serving.config import ServerConfig
from refinery.serving.metrics import Metrics
from refinery.serving.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    RefineryInfo,
    ResponseMessage,
    new_id,
)
from refinery.serving.service import Outcome, Prepared, Service, loop_alarms, trace_summary
from refinery.serving.streaming import chat_chunks, completion_chunks, sse, usage_info
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)
BackendFactory = Callable[[], Awaitable[Backend]]
# What the OpenAPI schema documents (and Schemathesis checks answers against): every
# error is the OpenAI error body, never FastAPI's default 422 shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "Refused (OpenAI error schema)."},
    "5XX": {"model": ErrorResponse, "description": "Failed (OpenAI error schema)."}}
SSE = {"text/event-stream": {"schema": {  # one server-sent event: data is a JSON chunk
    "type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}}}


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    """An error in the OpenAI schema: ``{"error": {"message", "type", "param", "code"}}``.

    Args:
        status: The HTTP status.
        message: What went wrong, for a person to read.
        type_: The OpenAI error type (``invalid_request_error``...).
        param: The request field at fault, if one is.
        code: A machine-readable code (``model_not_found``...), if any.

    Returns:
        The JSON response.
    """
    # A message quoting client text could hold a lone surrogate, which UTF-8 cannot
    # encode: escape it, or rendering the error would itself fail with a 500.
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status)


class BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with a 413.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body (no length) is counted as it arrives and refused once over,
    so an endless upload cannot fill memory.
    """

    def __init__(self, app: Any, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            response = error_response(413, f"request body of {int(length)} bytes is over the "
                                      f"limit of {self.limit}", "invalid_request_error")
            return await response(scope, receive, send)
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Raised inside the route's body read: FastAPI re-raises HTTPException
                    # as is, and the app's handler turns it into the OpenAI error body.
                    raise StarletteHTTPException(413, f"request body is over the limit of "
                                                      f"{self.limit} bytes")
            return message

        await self.app(scope, counted, send)


def create_app(config: ServerConfig | None = None, *, backend: Backend | None = None,
               backend_factory: BackendFactory | None = None) -> FastAPI:
    """Build the app. With ``backend_factory`` the engine starts in the background
    and /health answers 503 until it is ready."""
    config = config or ServerConfig()
    service = Service(config, backend)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async def start() -> None:
            try:
                service.backend = await backend_factory()
            except Exception as exc:
                service.start_error = str(exc)
                log.error("engine failed to start: %s", exc)

        async def supervise() -> None:
            """Apply ``config.on_engine_death`` when the engine dies for good."""
            restarts = 0
            while True:
                await asyncio.sleep(config.engine_check_seconds)
                dead = service.backend
                # Only a backend that says it is dead for good counts; an unreachable
                # upstream (OpenAIBackend) recovers by itself and is left alone.
                if dead is None or not getattr(dead, "dead", False):
                    continue
                if config.on_engine_death == "restart" and restarts < config.max_engine_restarts:
                    restarts += 1
                    log.error("engine died; restarting it (%d of %d)", restarts,
                              config.max_engine_restarts)
                    service.backend = None  # /health says "starting" meanwhile
                    try:
                        await dead.aclose()
                    except Exception as exc:  # the old engine is gone either way
                        log.warning("closing the dead engine failed: %s", exc)
                    await start()
                    continue
                log.error("engine died; stopping the server (on_engine_death=%s)",
                          config.on_engine_death)
                app.state.engine_died = True
                stop = getattr(app.state, "stop_server", None)
                if stop is not None:
                    stop()
                return

        starter = asyncio.ensure_future(start()) if backend_factory else None
        supervisor = asyncio.ensure_future(supervise()) if backend_factory else None
        yield
        for task in (starter, supervisor):
            if task is not None:
                task.cancel()
        if service.backend is not None and backend_factory is not None:
            await service.backend.aclose()

    app = FastAPI(title="refinery", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    app.state.metrics = metrics
    # The runner (refinery serve) sets stop_server so on_engine_death=exit can stop it.
    app.state.stop_server = None
    app.state.engine_died = False

    # -- errors: always the OpenAI schema --------------------------------------------------

    @app.exception_handler(RefineryError)
    async def on_refinery_error(request: Request, exc: RefineryError):
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        msg = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: "
                        f"{e.get('msg')}" for e in errs[:5])
        return error_response(400, msg or "invalid request", "invalid_request_error",
                              ".".join(loc) or None)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error",
                413: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return error_response(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")

    app.add_middleware(BodyLimit, limit=config.max_body_bytes)

    # -- auth and capacity -------------------------------------------------------------------

    async def authorize(request: Request) -> None:
        if not config.api_keys:
            return
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        # Compare against every key, in constant time each, without early exit.
        ok = False
        for key in config.api_keys:
            ok |= hmac.compare_digest(token.encode(), key.encode())
        if not ok:
            raise AuthenticationError("invalid or missing API key", code="invalid_api_key")

    @contextlib.asynccontextmanager
    async def admitted():
        if service.in_flight >= config.max_concurrent_requests:
            raise OverCapacityError(f"server is at capacity ({config.max_concurrent_requests} "
                                    "requests in flight); retry later")
        service.in_flight += 1
        metrics.in_flight.inc()
        try:
            yield
        finally:
            service.in_flight -= 1
            metrics.in_flight.dec()

    def observe(prep: Prepared, endpoint: str, status: str, outcome: Outcome | None,
                seconds: float) -> None:
        # The root strategy's name, not the whole spec: clients choose specs freely
        # (cot(instruction='...') has endless variants) and every distinct label value
        # would be a new time series kept forever.
        strategy = prep.spec.split("(", 1)[0] if prep.spec else "passthrough"
        labels = {"model": config.model, "strategy": strategy}
        metrics.requests.labels(**labels, endpoint=endpoint, status=status).inc()
        metrics.latency.labels(**labels).observe(seconds)
        if outcome is not None:
            metrics.tokens.labels(**labels, kind="prompt").inc(outcome.usage.prompt_tokens)
            metrics.tokens.labels(**labels, kind="completion").inc(
                outcome.usage.completion_tokens)
            metrics.calls.labels(**labels).inc(outcome.usage.calls)
            metrics.loop_alarms.labels(**labels).inc(sum(loop_alarms(t)
                                                         for t in outcome.traces))

    def info(prep: Prepared) -> Callable[[Outcome], RefineryInfo]:
        def make(outcome: Outcome) -> RefineryInfo:
            trace = None
            if prep.trace_mode == "summary":
                trace = [trace_summary(t) for t in outcome.traces]
            elif prep.trace_mode == "full":
                trace = [t.model_dump(mode="json") for t in outcome.traces]
            return RefineryInfo(strategy=prep.spec, calls=outcome.usage.calls,
                                seconds=round(outcome.seconds, 3), trace=trace)
        return make

    async def run_or_disconnect(request: Request, prep: Prepared) -> Outcome:
        """Run the request; if the client goes away, cancel it (aborting backend work)."""
        work = asyncio.ensure_future(service.run(prep))
        try:
            while not work.done():
                await asyncio.wait({work}, timeout=0.5)
                if not work.done() and await request.is_disconnected():
                    work.cancel()
                    break
            return await work
        finally:
            work.cancel()

    async def serve(request: Request, req: Any, endpoint: str) -> Response:
        prep = service.prepare(req)
        t0 = time.monotonic()
        rid, created = new_id("chatcmpl" if endpoint == "chat" else "cmpl"), int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        if req.stream:
            async def stream():
                status = "ok"
                async with admitted():
                    try:
                        if endpoint == "chat":
                            chunks = chat_chunks(service, prep, rid=rid, created=created,
                                                 model=req.model, include_usage=include_usage,
                                                 info=info(prep))
                        else:
                            chunks = completion_chunks(service, prep, rid=rid, created=created,
                                                       model=req.model,
                                                       include_usage=include_usage)
                        async for event in sse(chunks):
                            yield event
                    except BaseException:
                        status = "aborted"
                        raise
                    finally:
                        observe(prep, endpoint, status, None, time.monotonic() - t0)

            if service.in_flight >= config.max_concurrent_requests:
                raise OverCapacityError("server is at capacity; retry later")
            return StreamingResponse(stream(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache",
                                              "X-Accel-Buffering": "no"})
        async with admitted():
            try:
                outcome = await run_or_disconnect(request, prep)
            except RefineryError as exc:
                observe(prep, endpoint, str(exc.status), None, time.monotonic() - t0)
                raise
        observe(prep, endpoint, "200", outcome, time.monotonic() - t0)
        u, ext = usage_info(outcome), info(prep)(outcome)
        if endpoint == "chat":
            choices = [ChatChoice(index=i, message=ResponseMessage(
                content=t.attempt.text if t.attempt else ""),
                finish_reason=t.attempt.finish_reason if t.attempt else "stop")
                for i, t in enumerate(outcome.traces)]
            body: Any = ChatCompletionResponse(id=rid, created=created, model=req.model,
                                               choices=choices, usage=u, refinery=ext)
        else:
            choices = [CompletionChoice(index=i, text=t.attempt.text if t.attempt else "",
                                        finish_reason=t.attempt.finish_reason
                                        if t.attempt else "stop")
                       for i, t in enumerate(outcome.traces)]
            body = CompletionResponse(id=rid, created=created, model=req.model,
                                      choices=choices, usage=u, refinery=ext)
        return JSONResponse(body.model_dump(mode="json", exclude_none=True))

    # -- routes ------------------------------------------------------------------------------

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)], responses={
        200: {"model": ChatCompletionResponse, "content": SSE}, **ERRORS})
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await serve(request, req, "chat")

    @app.post("/v1/completions", dependencies=[Depends(authorize)], responses={
        200: {"model": CompletionResponse, "content": SSE}, **ERRORS})
    async def completions(req: CompletionRequest, request: Request):
        return await serve(request, req, "completion")

    @app.get("/v1/models", dependencies=[Depends(authorize)], responses=ERRORS)
    async def models() -> ModelList:
        from refinery.engine.graph import worst_case_calls
        from refinery.strategies import build_with_graph

        cards = [ModelCard(id=config.model)]
        for name, spec in config.presets.items():
            _, graph = build_with_graph(spec, max_calls=None)
            cards.append(ModelCard(id=f"{name}@{config.model}", strategy=spec,
                                   worst_case_calls=worst_case_calls(graph)))
        return ModelList(data=cards)

    @app.get("/health", response_class=Response, responses={
        200: {"description": "Ready (empty body)."}, **ERRORS})
    async def health():
        check = getattr(service.backend, "check_health", None)
        if check is not None:
            await check()  # e.g. OpenAIBackend: is the upstream reachable now?
        if service.ready:
            return Response(status_code=200)
        why = service.start_error or (getattr(service.backend, "status", "engine died")
                                      if service.backend else "starting")
        return error_response(503, f"not ready: {why}", "service_unavailable")

    @app.get("/metrics", response_class=Response, responses={
        200: {"description": "Prometheus text.", "content": {"text/plain": {}}}})
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
