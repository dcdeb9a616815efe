"""``POST /v1/completions`` and ``POST /v1/fim/completions``: requests and the shared response, ordered
as in OpenAI's legacy completions reference, then quicksilver's diffusion extras. A completion with
a ``suffix`` is fill-in-the-middle: the canvas is the gap between prompt and suffix."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from .base import DiffusionExtras, DiffusionStats, StreamOptions, UsageInfo


class CompletionRequest(DiffusionExtras):
    model: str | None = None
    prompt: str | list[str] | list[int]
    best_of: int | None = Field(default=None, ge=1)
    echo: bool | None = False
    frequency_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=5)
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=1, ge=1)
    presence_penalty: float | None = Field(default=0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    suffix: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    user: str | None = None


class FimCompletionRequest(CompletionRequest):
    """Fill in the middle: ``prompt`` is the text before the gap, ``suffix`` the text after it."""

    prompt: str
    suffix: str | None = ""


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: Literal["stop", "length", "cancelled", "error"] | None


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None
    diffusion: DiffusionStats | None = None
