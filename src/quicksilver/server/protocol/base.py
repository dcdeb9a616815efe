"""Pydantic models shared by the endpoints: the base model, errors, usage, models list, diffusion extras.

Request models tolerate unknown fields (the OpenAI API does; clients send vendor fields) but type
and range-check every known one: a bad value is a 400 in the error envelope, never a 500.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Policy = Literal["low_confidence", "threshold", "margin", "entropy", "random", "verify"]


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens served by the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class DiffusionStats(BaseModel):
    """Per-response decoding numbers (quicksilver extra): forward passes, steps, tokens per forward."""

    nfe: int = 0
    steps: int = 0
    tpf: float = 0.0


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = False


class DiffusionExtras(OpenAIBaseModel):
    """Diffusion decoding fields, accepted at the top level (the SDK's ``extra_body`` puts them there)."""

    steps: int | None = Field(
        default=None, ge=1, le=4096, description="refinement steps (a cap for threshold)"
    )
    block_length: int | None = Field(
        default=None, ge=1, le=4096, description="semi-autoregressive block length"
    )
    window: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="decode window: positions a step computes inside a block-causal model's block",
    )
    threshold: float | None = Field(
        default=None, gt=0.0, le=1.0, description="confidence bound of `threshold`"
    )
    policy: Policy | None = Field(default=None, description="unmasking policy")
    draft: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="verify policy (causal models): masks drafted per pass; 0 = one token per pass",
    )
    copy_drafts: bool | None = Field(
        default=None,
        description="verify policy: also draft by copying from the context where the last tokens"
        " recur (default on; lossless either way)",
    )
    diffusing: bool | None = Field(
        default=False, description="stream canvas states at each step (see docs)"
    )
    realtime: bool | None = Field(
        default=False,
        description="lowest time to first token: no reasoning "
        "phase unless asked, small first block",
    )
    ignore_eos: bool | None = Field(
        default=False, description="decode the whole canvas (benchmarks)"
    )
    top_k: int | None = Field(
        default=None, ge=0, description="sample among the k most likely tokens (0: all)"
    )


def diffusion_fields(req: DiffusionExtras) -> dict[str, Any]:
    """The request's diffusion extras by name (for a request planned as a chat completion)."""
    return {k: getattr(req, k) for k in DiffusionExtras.model_fields}


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "quicksilver"
    max_model_len: int | None = None
    attention: str | None = None  # quicksilver extra: bidirectional | block_causal | causal


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard] = Field(default_factory=list)


def usage(
    prompt: int, completion: int, reasoning: int | None = None, cached: int = 0
) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if reasoning is not None:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return u
