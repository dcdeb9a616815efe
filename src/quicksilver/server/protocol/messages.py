"""``POST /v1/messages`` and ``/v1/messages/count_tokens``: Anthropic's Messages API request models
(https://docs.anthropic.com/en/api/messages), its error envelope, and the middleware that puts
every error on these routes in that envelope.

The request models accept what the API documents for text and tools: ``system`` as a string or text
blocks; ``text``, ``tool_use``, ``tool_result`` (string or text-block content, ``is_error``) and
``thinking`` content blocks; tools with ``input_schema``; ``tool_choice`` ``auto | any | tool |
none`` with ``disable_parallel_tool_use``; ``thinking``; and quicksilver's diffusion extras at the
top level as on the OpenAI routes. Blocks the server cannot read (images, documents, server tools)
are a 400 naming the block.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .base import DiffusionExtras
from .chat import FUNCTION_NAME

PREFIX = "/v1/messages"  # every route under it answers errors in Anthropic's envelope
# status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class Block(BaseModel):
    """A content block; its ``type`` decides which fields matter (others are ignored)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking (sent back in a conversation; not re-read)


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None  # "custom", or absent; server tools (web_search_...) are refused


class ToolChoiceParam(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(BaseModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1)


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None


class MessagesRequest(CountTokensRequest, DiffusionExtras):
    max_tokens: int = Field(ge=1)
    metadata: dict[str, Any] | None = None  # accepted (user_id), not used
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    service_tier: str | None = None  # accepted, not used


def error_envelope(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``, the type by status."""
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class AnthropicErrors:
    """ASGI middleware: an error response on a Messages route (whoever answered it: the API-key
    guard, the lifecycle's limits, a handler) is re-enveloped from the OpenAI shape into
    Anthropic's, status and headers kept. Success responses pass through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()

        async def wrapped(msg: Message) -> None:
            nonlocal start
            if msg["type"] == "http.response.start" and msg["status"] >= 400:
                start = msg
                return
            if start is None:
                await send(msg)
                return
            body.extend(msg.get("body", b""))
            if not msg.get("more_body"):
                await _send_enveloped(send, start, bytes(body))

        await self.app(scope, receive, wrapped)


async def _send_enveloped(send: Send, start: Message, body: bytes) -> None:
    try:
        err = json.loads(body)["error"]
        message = str(err.get("message", "")) if isinstance(err, dict) else str(err)
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    out = json.dumps(error_envelope(start["status"], message)).encode()
    headers = [
        (k, v)
        for k, v in start.get("headers", [])
        if k.lower() not in (b"content-length", b"content-type")
    ]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(out)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": out})
