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
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.backends.base import Backend
from engine.errors import AuthenticationError, OverCapacityError, RefineryError
from serving.config import ServerConfig
from serving.metrics import Metrics
from serving.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    RefineryInfo,
    ResponseMessage,
    new_id,
)
from serving.service import Outcome, Prepared, Service, loop_alarms, trace_summary
from serving.streaming import chat_chunks, completion_chunks, sse, usage_info

log = logging.getLogger(__name__)
BackendFactory = Callable[[], Awaitable[Backend]]


def error_response(status: int, message: str, type_: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status)


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

        starter = asyncio.ensure_future(start()) if backend_factory else None
        yield
        if starter is not None:
            starter.cancel()
        if service.backend is not None and backend_factory is not None:
            await service.backend.aclose()

    app = FastAPI(title="refinery", version="0.1.0", lifespan=lifespan)
    app.state.service = service
    app.state.metrics = metrics

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

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > config.max_body_bytes:
            return error_response(413, f"request body of {length} bytes is over the limit of "
                                  f"{config.max_body_bytes}", "invalid_request_error")
        return await call_next(request)

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
        labels = {"model": config.model, "strategy": prep.spec or "passthrough"}
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

    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        return await serve(request, req, "chat")

    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(req: CompletionRequest, request: Request):
        return await serve(request, req, "completion")

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models() -> ModelList:
        from engine.graph import worst_case_calls
        from strategies import build_with_graph

        cards = [ModelCard(id=config.model)]
        for name, spec in config.presets.items():
            _, graph = build_with_graph(spec, max_calls=None)
            cards.append(ModelCard(id=f"{name}@{config.model}", strategy=spec,
                                   worst_case_calls=worst_case_calls(graph)))
        return ModelList(data=cards)

    @app.get("/health")
    async def health():
        if service.ready:
            return Response(status_code=200)
        why = service.start_error or ("engine died" if service.backend else "starting")
        return error_response(503, f"not ready: {why}", "service_unavailable")

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    return app
