"""SamplerConfig: every decoding option, validated in one place. CLI flags map 1:1 onto fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError
from .policies import POLICIES


@dataclass
class SamplerConfig:
    max_new_tokens: int = 128  # canvas length (CLI --max-tokens)
    policy: str = "threshold"  # a name from sampling.core.policies.POLICIES
    threshold: float = 0.9  # confidence bound of the `threshold` policy, in (0, 1]
    steps: int | None = None  # total refinement steps (schedule policies; a cap for `threshold`)
    block_length: int | None = None  # semi-AR block; default: the model's block size or 32
    # decode window (block-causal models, block cache): positions a step computes inside the model
    # block, the rest served from cached keys/values; None: the device's default (WINDOW_DEFAULTS)
    window: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # sample among the k most likely tokens (0: all)
    seed: int | None = None
    # verify policy (causal models): masks drafted per pass; None: the model's draft_length; 0: AR
    draft: int | None = None
    # verify policy: drafts may also be copied from the row's own context where its last tokens
    # recur (sampling/decoders/copy_drafts.py); lossless either way. Off with draft = 0 (plain AR).
    copy_drafts: bool = True
    revise_threshold: float | None = None  # re-mask committed tokens whose confidence falls below
    max_revisions: int = 1  # per position: bounds revision so decoding always terminates
    # editing (LLaDA2.1's token-to-token step): a committed token of the block being decoded is
    # rewritten to the model's top token where that differs and its probability exceeds this
    # (0.0: wherever it differs); None: off. See state.Row.advance for when a block ends.
    editing_threshold: float | None = None
    max_post_steps: int = 16  # editing: extra passes over a filled block while they still edit
    # honest length: stop once a stop token and all before it are committed
    stop_at_eos: bool = True
    record_canvas: bool = False  # put the whole canvas in every step event (live views)

    def validate(self, max_context: int | None = None, prompt_len: int = 0) -> SamplerConfig:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; choose one of {sorted(POLICIES)}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ConfigError(
                f"max_new_tokens must be a positive integer, got {self.max_new_tokens}"
            )
        if not (0.0 < float(self.threshold) <= 1.0):
            raise ConfigError(f"threshold must be in (0, 1], got {self.threshold}")
        if self.steps is not None and self.steps <= 0:
            raise ConfigError(f"steps must be positive, got {self.steps}")
        if self.block_length is not None and self.block_length <= 0:
            raise ConfigError(f"block_length must be positive, got {self.block_length}")
        if self.window is not None and (not isinstance(self.window, int) or self.window <= 0):
            raise ConfigError(f"window must be a positive integer, got {self.window}")
        if self.draft is not None and (
            not isinstance(self.draft, int) or not 0 <= self.draft <= 64
        ):
            raise ConfigError(f"draft must be an integer in [0, 64], got {self.draft}")
        if not (0.0 <= float(self.temperature) <= 100.0):
            raise ConfigError(f"temperature must be in [0, 100], got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be a non-negative integer, got {self.top_k}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.revise_threshold is not None and not (0.0 < self.revise_threshold < 1.0):
            raise ConfigError(f"revise_threshold must be in (0, 1), got {self.revise_threshold}")
        if self.editing_threshold is not None and not (0.0 <= self.editing_threshold < 1.0):
            raise ConfigError(f"editing_threshold must be in [0, 1), got {self.editing_threshold}")
        if not isinstance(self.max_post_steps, int) or not 0 <= self.max_post_steps <= 64:
            raise ConfigError(
                f"max_post_steps must be an integer in [0, 64], got {self.max_post_steps}"
            )
        if not (0 <= self.max_revisions <= 8):
            raise ConfigError(f"max_revisions must be in [0, 8], got {self.max_revisions}")
        if max_context is not None:
            if prompt_len >= max_context:
                raise ConfigError(
                    f"prompt of {prompt_len} tokens does not fit the context of {max_context}"
                )
            if prompt_len + self.max_new_tokens > max_context:
                raise ConfigError(
                    f"max_new_tokens={self.max_new_tokens} plus a prompt of {prompt_len} tokens exceeds "
                    f"the context of {max_context}; at most {max_context - prompt_len} new tokens fit"
                )
        return self

    def replace(self, **changes: Any) -> SamplerConfig:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown sampler options: {sorted(unknown)}")
        return dataclasses.replace(self, **changes)
