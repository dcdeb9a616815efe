"""``POST /v1/responses`` (OpenAI Responses API): the request model, ordered as in OpenAI's API
reference (https://platform.openai.com/docs/api-reference/responses/create).

Input items are kept as plain dicts here and checked where they become chat messages
(``serving/responses.to_chat``), so one bad item is a 400 naming its index.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import DiffusionExtras, OpenAIBaseModel
from .chat import FUNCTION_NAME, ReasoningEffort


class ResponseTool(OpenAIBaseModel):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseNamedTool(OpenAIBaseModel):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(default=None, pattern=FUNCTION_NAME)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(OpenAIBaseModel):
    format: TextFormat | None = None


class ReasoningConfig(OpenAIBaseModel):
    effort: ReasoningEffort | None = None
    summary: str | None = None


class ResponsesRequest(DiffusionExtras):
    input: str | list[dict[str, Any]]
    model: str | None = None
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    store: bool | None = None
    stream: bool | None = False
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    text: TextConfig | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponseNamedTool | None = None
    tools: list[ResponseTool] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
