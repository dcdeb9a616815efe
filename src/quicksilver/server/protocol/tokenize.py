"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extras): request models."""

from __future__ import annotations

from pydantic import Field

from .base import OpenAIBaseModel
from .chat import ChatMessage, Tool


class TokenizeRequest(OpenAIBaseModel):
    """A prompt, or messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = Field(default=None, max_length=1_000_000)
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None  # rendered into the prompt as chat completions do
    add_generation_prompt: bool | None = True
    return_token_strs: bool | None = False


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int] = Field(max_length=100_000)
