"""The FastAPI app: routes, the API-key guard, the request lifecycle (``lifecycle.Lifecycle``: body,
admission, deadline, drain, catch-all), and the error handlers that put every failure in the OpenAI
envelope with its status — never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from .config import ServerConfig
from .errors import APIError, error_body, error_response, overloaded
from .generation import Backend
from .lifecycle import Drain, Lifecycle
from .metrics import Metrics
from .playground import install_browser_rules, is_public
from .playground import router as playground_router
from .protocol import ErrorResponse, ModelCard, ModelList
from .protocol_chat import ChatCompletionRequest, ChatCompletionResponse
from .protocol_completion import CompletionRequest, CompletionResponse, FimCompletionRequest
from .serving_chat import OpenAIServingChat
from .serving_completion import OpenAIServingCompletion
from .serving_engine import sse_guard, until_disconnect
from .twin import ByModel

log = logging.getLogger("quicksilver.server")
OPEN_PATHS = ("/health",)
REJECTED = {400: "invalid", 429: "too_many", 503: "overloaded"}  # APIError status -> reason counted
ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (400, 401, 404, 408, 413, 429, 500, 503, 504)
}


class Guard:
    """The API key, as pure ASGI middleware (streaming and disconnects pass through untouched)."""

    def __init__(self, app: ASGIApp, config: ServerConfig, state: ServerState) -> None:
        self.app, self.cfg, self.state = app, config, state
        self.key = config.resolved_api_key()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        if self.key and path not in OPEN_PATHS and not is_public(path):
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                self.state.metrics.inc("requests_rejected_total", reason="auth")
                await error_response(
                    APIError(
                        401,
                        "invalid or missing API key (send 'Authorization: Bearer KEY')",
                        "invalid_request_error",
                        None,
                        "invalid_api_key",
                    )
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)


class SSEResponse(StreamingResponse):
    """A streaming response that always listens for the client going away (Starlette only does so
    for ASGI < 2.4; otherwise it notices on the next failed send, which may be many steps later when
    steps commit no final text). On disconnect the body iterator is cancelled, which cancels the
    engine requests.

    Admission is decided before the first byte: the stream's first chunk is awaited before the
    status line, and the streams yield nothing until every choice has been submitted to the engine
    — so a refusal (a full engine queue) is a real 503/429 with ``Retry-After``, not a 200 whose
    first event is an error."""

    def __init__(self, gen: AsyncGenerator[str, None], metrics: Metrics) -> None:
        super().__init__(
            gen,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.raw, self.metrics = gen, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    first: str | None = await self.raw.__anext__()
                except StopAsyncIteration:
                    first = None
                except APIError as e:
                    if e.status in REJECTED:
                        self.metrics.inc("requests_rejected_total", reason=REJECTED[e.status])
                    await error_response(e)(scope, receive, send)
                    tg.cancel_scope.cancel()
                    return
                self.body_iterator = sse_guard(_resume(first, self.raw), self.metrics)
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


async def _resume(first: str | None, rest: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    async with contextlib.aclosing(rest) as inner:
        if first is not None:
            yield first
            async for chunk in inner:
                yield chunk


class ServerState:
    def __init__(
        self, backend: Backend, config: ServerConfig, twins: Sequence[Backend] = ()
    ) -> None:
        self.backend, self.config = backend, config
        self.backends = [backend, *twins]  # the served models; requests pick one by `model`
        self.metrics = Metrics(backend.name)
        m = self.metrics
        self.chat = ByModel(
            OpenAIServingChat(backend, config, m),
            {t.name: OpenAIServingChat(t, config, m) for t in twins},
        )
        self.completion = ByModel(
            OpenAIServingCompletion(backend, config, m),
            {t.name: OpenAIServingCompletion(t, config, m) for t in twins},
        )
        self.drain = Drain()

    def check_capacity(self) -> None:
        eng = self.backend.engine.engine
        if eng.num_waiting >= self.config.max_waiting:
            raise overloaded(f"{eng.num_waiting} requests are waiting; try again shortly")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = str(e.get("msg", "invalid value"))
    return (f"{param}: {msg}" if param else msg), param


def build_app(backend: Backend, config: ServerConfig, twins: Sequence[Backend] = ()) -> FastAPI:
    """The app serving ``backend`` (and ``twins``, e.g. the AR twin, under their own model ids)."""
    state = ServerState(backend, config, twins)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
        for b in state.backends:
            b.engine.start()
        yield
        for b in state.backends:
            await b.engine.stop()

    app = FastAPI(
        title="quicksilver",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="OpenAI-compatible server for diffusion language models.",
    )
    app.state.qs = state
    app.add_middleware(Lifecycle, config=config, state=state)
    app.add_middleware(Guard, config=config, state=state)  # outermost: no key, no work
    install_browser_rules(app, config.allowed_origins)
    app.include_router(playground_router)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> Response:
        if exc.status in REJECTED:
            state.metrics.inc("requests_rejected_total", reason=REJECTED[exc.status])
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        msg, param = _validation_message(exc)
        state.metrics.inc("requests_rejected_total", reason="invalid")
        return JSONResponse(error_body(msg, "invalid_request_error", param, None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        msg = (
            f"no route {request.method} {request.url.path}"
            if exc.status_code in (404, 405)
            else str(exc.detail)
        )
        return JSONResponse(
            error_body(msg, kind, None, None), status_code=exc.status_code, headers=exc.headers
        )  # 405 keeps its Allow header

    def sse_response(gen: AsyncGenerator[str, None]) -> StreamingResponse:
        return SSEResponse(gen, state.metrics)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERRORS)
    async def chat(req: ChatCompletionRequest, request: Request) -> Any:
        arrival = time.perf_counter()
        state.metrics.inc("requests_total", endpoint="chat")
        state.check_capacity()
        if req.stream:  # planned off the event loop (templates, tokenizing, schema compiling)
            return sse_response(await asyncio.to_thread(state.chat.stream, req, arrival))
        return JSONResponse(
            await until_disconnect(request, state.chat.create(req, arrival), state.metrics)
        )

    @app.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        return await _completion(req, request, fim=False)

    @app.post("/v1/fim/completions", response_model=CompletionResponse, responses=ERRORS)
    async def fim(req: FimCompletionRequest, request: Request) -> Any:
        return await _completion(req, request, fim=True)

    async def _completion(req: CompletionRequest, request: Request, fim: bool) -> Any:
        arrival = time.perf_counter()
        state.metrics.inc("requests_total", endpoint="fim" if fim else "completions")
        state.check_capacity()
        if req.stream:
            return sse_response(await asyncio.to_thread(state.completion.stream, req, arrival, fim))
        return JSONResponse(
            await until_disconnect(
                request, state.completion.create(req, arrival, fim), state.metrics
            )
        )

    def card(b: Backend) -> ModelCard:
        return ModelCard(id=b.name, max_model_len=b.max_context, attention=b.attention)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        return ModelList(data=[card(b) for b in state.backends])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERRORS)
    async def model(model_id: str) -> ModelCard:
        found = [b for b in state.backends if b.name == model_id]
        if not found:
            raise APIError(
                404,
                f"the model {model_id!r} does not exist",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return card(found[0])

    @app.get("/health")
    async def health() -> Response:
        if state.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        ok = all(b.engine.alive or not b.engine.engine.has_work for b in state.backends)
        return JSONResponse(
            {"status": "ok" if ok else "engine stopped"}, status_code=200 if ok else 503
        )

    @app.get("/metrics")
    async def metrics() -> Response:
        text = state.metrics.render(backend.engine.engine, len(state.drain.inflight))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
