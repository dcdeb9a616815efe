"""``POST /v1/apply/completions`` (apply-edit) and ``POST /v1/edit/completions`` (next-edit), Mercury
Edit's routes: an OpenAI chat-shaped request whose one user message holds the tagged sections
(``suite/edit_format.py``); the system prompt is the server's. The response is the chat completion
(``protocol/chat.ChatCompletionResponse``), streamed as ``chat.completion.chunk`` objects.

Only the fields below are read; like every request model here, unknown fields are tolerated and
ignored (``tools``, ``response_format`` or ``reasoning_effort`` change nothing: the turn is always
plain text, without a reasoning phase)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import DiffusionExtras, OpenAIBaseModel, StreamOptions
from .chat import TextPart


class EditMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None


class EditCompletionRequest(DiffusionExtras):
    """Exactly one ``user`` message holding the route's tagged sections; any other role is a 400
    (the system prompt is kept server-side)."""

    messages: list[EditMessage] = Field(min_length=1)
    model: str | None = None
    logprobs: bool | None = False
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None
