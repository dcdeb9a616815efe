"""The HTTP routes, on one ``APIRouter``: the OpenAI endpoints (chat, completions, FIM, responses,
models), Mercury Edit's apply-edit and next-edit (``/v1/apply/completions``, ``/v1/edit/completions``), Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``), the vLLM-style extras (``/tokenize``, ``/detokenize``), ``/health`` (GET and HEAD) and
``/metrics``. Handlers only translate: the serving objects on ``app.state.qs`` do the work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .protocol.base import ErrorResponse, ModelCard, ModelList
from .protocol.chat import ChatCompletionRequest, ChatCompletionResponse
from .protocol.completion import CompletionRequest, CompletionResponse, FimCompletionRequest
from .protocol.edit import EditCompletionRequest
from .protocol.errors import APIError, bad_request
from .protocol.messages import CountTokensRequest, MessagesRequest
from .protocol.responses import ResponsesRequest
from .protocol.sse import SSEResponse
from .protocol.tokenize import DetokenizeRequest, TokenizeRequest
from .serving.edit import APPLY, NEXT_EDIT, EditRoute
from .serving.engine import until_disconnect
from .serving.tools import template_messages, tool_dicts

ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": ErrorResponse} for c in (400, 401, 404, 408, 413, 429, 500, 503, 504)
}
router = APIRouter()


def _state(request: Request) -> Any:
    return request.app.state.qs


async def _sse(
    request: Request, start: Callable[[], AsyncGenerator[str, None]], kind: str = "chat"
) -> StreamingResponse:
    """A stream planned off the event loop (templates, tokenizing, schema compiling)."""
    return SSEResponse(await asyncio.to_thread(start), _state(request).metrics, kind)


async def _json(request: Request, work: Awaitable[dict[str, Any]]) -> JSONResponse:
    return JSONResponse(await until_disconnect(request, work, _state(request).metrics))


def _admit(request: Request, endpoint: str) -> float:
    st = _state(request)
    st.metrics.inc("requests_total", endpoint=endpoint)
    st.check_capacity()
    return time.perf_counter()


@router.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=ERRORS)
async def chat(req: ChatCompletionRequest, request: Request) -> Any:
    arrival = _admit(request, "chat")
    serving = _state(request).chat.pick(req.model)
    if req.stream:
        return await _sse(request, lambda: serving.stream(req, arrival))
    return await _json(request, serving.create(req, arrival))


@router.post("/v1/responses", responses=ERRORS)
async def responses(req: ResponsesRequest, request: Request) -> Any:
    arrival = _admit(request, "responses")
    serving = _state(request).responses.pick(req.model)
    if req.stream:
        return await _sse(request, lambda: serving.stream(req, arrival), "responses")
    return await _json(request, serving.create(req, arrival))


async def _completion(req: CompletionRequest, request: Request, fim: bool) -> Any:
    arrival = _admit(request, "fim" if fim else "completions")
    serving = _state(request).completion.pick(req.model)
    if req.stream:
        return await _sse(request, lambda: serving.stream(req, arrival, fim))
    return await _json(request, serving.create(req, arrival, fim))


@router.post("/v1/messages", responses=ERRORS)
async def messages(req: MessagesRequest, request: Request) -> Any:
    """Anthropic's Messages API (errors in its envelope: ``protocol/messages.py``)."""
    arrival = _admit(request, "messages")
    serving = _state(request).messages.pick(req.model)
    if req.stream:
        return await _sse(request, lambda: serving.stream(req, arrival), "messages")
    return await _json(request, serving.create(req, arrival))


@router.post("/v1/messages/count_tokens", responses=ERRORS)
async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, Any]:
    serving = _state(request).messages.pick(req.model)
    serving.check_model(req.model)
    return await asyncio.to_thread(serving.count_tokens, req)


@router.post("/v1/completions", response_model=CompletionResponse, responses=ERRORS)
async def completions(req: CompletionRequest, request: Request) -> Any:
    return await _completion(req, request, fim=False)


@router.post("/v1/fim/completions", response_model=CompletionResponse, responses=ERRORS)
async def fim(req: FimCompletionRequest, request: Request) -> Any:
    return await _completion(req, request, fim=True)


async def _edit(req: EditCompletionRequest, request: Request, route: EditRoute) -> Any:
    arrival = _admit(request, route.endpoint)
    serving = _state(request).edit.pick(req.model)
    if req.stream:
        return await _sse(request, lambda: serving.stream(req, route, arrival))
    return await _json(request, serving.create(req, route, arrival))


@router.post("/v1/apply/completions", response_model=ChatCompletionResponse, responses=ERRORS)
async def apply_edit(req: EditCompletionRequest, request: Request) -> Any:
    """Apply-edit: merge the ``<|update_snippet|>`` into the ``<|original_code|>``; the reply is
    the merged code (docs/SERVER.md, "Apply-edit and next-edit")."""
    return await _edit(req, request, APPLY)


@router.post("/v1/edit/completions", response_model=ChatCompletionResponse, responses=ERRORS)
async def next_edit(req: EditCompletionRequest, request: Request) -> Any:
    """Next-edit: rewrite the ``<|code_to_edit|>`` region around the ``<|cursor|>``; the reply is
    the rewritten region (docs/SERVER.md, "Apply-edit and next-edit")."""
    return await _edit(req, request, NEXT_EDIT)


@router.get("/v1/models", response_model=ModelList)
async def models(request: Request) -> ModelList:
    return ModelList(data=_state(request).cards())


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=ERRORS)
async def model(model_id: str, request: Request) -> ModelCard:
    found = [c for c in _state(request).cards() if c.id == model_id]
    if not found:
        raise APIError(
            404,
            f"the model {model_id!r} does not exist",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    return found[0]


@router.post("/tokenize", responses=ERRORS)
async def tokenize(req: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Token ids of a prompt, or of messages rendered by the chat template (as vLLM's)."""
    st = _state(request)
    st.chat.pick(req.model).check_model(req.model)
    tok = st.served.tokenizer
    if (req.prompt is None) == (req.messages is None):
        raise bad_request("send exactly one of prompt and messages", "prompt")
    if req.messages is not None:
        try:
            text = tok.apply_chat_template(
                template_messages(req.messages),
                tools=tool_dicts(req.tools) if req.tools else None,
                add_generation_prompt=bool(req.add_generation_prompt),
            )
        except Exception as e:  # a template error is the caller's input
            raise bad_request(str(e), "messages") from None
    else:
        text = req.prompt or ""
    ids = tok.encode(text)
    out: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": st.served.max_context,
        "tokens": ids,
    }
    if req.return_token_strs:
        out["token_strs"] = [tok.decode([t], skip_special_tokens=False) for t in ids]
    return out


@router.post("/detokenize", responses=ERRORS)
async def detokenize(req: DetokenizeRequest, request: Request) -> dict[str, Any]:
    st = _state(request)
    st.chat.pick(req.model).check_model(req.model)
    tok = st.served.tokenizer
    if any(not 0 <= t < tok.vocab_size for t in req.tokens):
        raise bad_request(f"token ids must lie in [0, {tok.vocab_size})", "tokens")
    return {"prompt": tok.decode(req.tokens, skip_special_tokens=False)}


FAILING_STEPS = 3  # steps in a row that fail their requests before /health reports degraded


def _status(request: Request) -> str:
    """ok, or why this server should get no traffic: its engine stopped, or keeps failing steps."""
    served_models = _state(request).served_models
    if not all(b.engine.alive or not b.engine.engine.has_work for b in served_models):
        return "engine stopped"
    if any(b.engine.engine.failing_steps >= FAILING_STEPS for b in served_models):
        return "degraded"
    return "ok"


def _healthy(request: Request) -> bool:
    return _status(request) == "ok"


@router.get("/health")
async def health(request: Request) -> Response:
    st = _state(request)
    if st.drain.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    status = _status(request)
    body = {
        "status": status,
        "runtime": {b.name: b.runtime for b in st.served_models},
        "step_errors": sum(b.engine.engine.totals["step_errors"] for b in st.served_models),
    }
    return JSONResponse(body, status_code=200 if status == "ok" else 503)


@router.head("/health", include_in_schema=False)
async def health_head(request: Request) -> Response:
    ok = _healthy(request) and not _state(request).drain.draining
    return Response(status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    st = _state(request)
    return Response(st.metrics.render(), media_type=CONTENT_TYPE_LATEST)
