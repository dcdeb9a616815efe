"""The FastAPI app: the guard middleware (request id, API key), the request lifecycle
(``lifecycle.Lifecycle``: body, admission, deadline, drain, catch-all), the serving state the routes use (the served models: the default one and its twins, picked by a request's
``model``), and the error handlers that put every failure in the OpenAI envelope with its status —
never a traceback. The routes are in ``routes.py``, the playground's in ``playground.py``."""

from __future__ import annotations

import gc
import hmac
import logging
import re
import uuid
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import ServerConfig
from .metrics import Metrics
from .playground import install_browser_rules, is_public
from .playground import router as playground_router
from .protocol.base import ModelCard
from .protocol.errors import REJECTED, APIError, error_body, error_response, overloaded
from .protocol.messages import AnthropicErrors
from .reliability.lifecycle import Drain, Lifecycle
from .routes import router
from .serving.chat import OpenAIServingChat
from .serving.completion import OpenAIServingCompletion
from .serving.edit import EDIT_ALIASES, EditServing
from .serving.generation import ServedModel
from .serving.messages import AnthropicServingMessages
from .serving.responses import OpenAIServingResponses
from .twin import ByModel

log = logging.getLogger("quicksilver.server")
OPEN_PATHS = ("/health",)
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")  # a client's X-Request-Id kept as given


def request_id(given: str | None) -> str:
    """The client's ``X-Request-Id`` when it is a plain token, else a fresh one."""
    return given if given and REQUEST_ID.match(given) else uuid.uuid4().hex


class Guard:
    """The request id and the API key, as pure ASGI middleware (streaming and disconnects pass
    through untouched)."""

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
        rid = request_id(headers.get("x-request-id"))
        scope.setdefault("state", {})["request_id"] = rid
        log.info("request %s %s %s", rid, scope["method"], path)

        async def tagged(msg: Message) -> None:  # every response carries the request id
            if msg["type"] == "http.response.start":
                msg = {**msg, "headers": [*msg.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(msg)

        if self.key and path not in OPEN_PATHS and not is_public(path):
            auth = headers.get("authorization", "")
            bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
            given = bearer or headers.get("x-api-key", "")  # x-api-key: Anthropic's clients
            if not hmac.compare_digest(given.encode(), self.key.encode()):
                self.state.metrics.inc("requests_rejected_total", reason="auth")
                await error_response(
                    APIError(
                        401,
                        "invalid or missing API key (send 'Authorization: Bearer KEY' or "
                        "'x-api-key: KEY')",
                        "invalid_request_error",
                        None,
                        "invalid_api_key",
                    )
                )(scope, receive, tagged)
                return
        await self.app(scope, receive, tagged)


class ServerState:
    def __init__(
        self, served: ServedModel, config: ServerConfig, twins: Sequence[ServedModel] = ()
    ) -> None:
        self.served, self.config = served, config
        self.served_models = [served, *twins]  # the served models; requests pick one by `model`
        self.drain = Drain()  # in-flight requests; set draining on SIGTERM/SIGINT
        self.metrics = m = Metrics(
            served.name, served.engine.engine, lambda: len(self.drain.inflight)
        )
        chats = {b.name: OpenAIServingChat(b, config, m) for b in self.served_models}
        self.chat = ByModel(chats[served.name], {t.name: chats[t.name] for t in twins})
        self.completion = ByModel(
            OpenAIServingCompletion(served, config, m),
            {t.name: OpenAIServingCompletion(t, config, m) for t in twins},
        )
        self.responses = ByModel(
            OpenAIServingResponses(chats[served.name]),
            {t.name: OpenAIServingResponses(chats[t.name]) for t in twins},
        )
        self.messages = ByModel(
            AnthropicServingMessages(chats[served.name]),
            {t.name: AnthropicServingMessages(chats[t.name]) for t in twins},
        )
        # apply-edit and next-edit, on the chat path: the edit model unless another is named
        edits = {b.name: EditServing(chats[b.name]) for b in self.served_models}
        editor = next((b.name for b in self.served_models if b.edits), served.name)
        self.edit = ByModel(edits[editor], edits | {alias: edits[editor] for alias in EDIT_ALIASES})

    def cards(self) -> list[ModelCard]:
        return [
            ModelCard(id=b.name, max_model_len=b.max_context, attention=b.attention)
            for b in self.served_models
        ]

    def check_capacity(self) -> None:
        eng = self.served.engine.engine
        if eng.num_waiting >= self.config.max_waiting:  # counted by the APIError handler
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


def build_app(
    served: ServedModel, config: ServerConfig, twins: Sequence[ServedModel] = ()
) -> FastAPI:
    """The app serving ``served`` (and ``twins``, e.g. the AR twin, under their own model ids)."""
    state = ServerState(served, config, twins)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
        # what start-up made (the model, its runtime, the imports: ~336k objects for the embedded
        # model) lives as long as the server: freeze it out of the collector, or each full
        # collection walks it all and holds the interpreter ~0.2 s, the /health tail under load
        gc.collect()
        gc.freeze()
        for b in state.served_models:
            b.engine.start()
        yield
        for b in state.served_models:
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
    app.add_middleware(Guard, config=config, state=state)  # outside the lifecycle: no key, no work
    app.add_middleware(AnthropicErrors)  # outside every source of errors on the Messages routes
    install_browser_rules(app, config.allowed_origins)  # outermost: foreign origins answered first
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
        # 405 keeps its Allow header
        return JSONResponse(
            error_body(msg, kind, None, None), status_code=exc.status_code, headers=exc.headers
        )

    app.include_router(router)
    return app
