"""ModelConfig: the one dataclass that describes every network quicksilver runs, plus test presets."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ConfigError

ATTENTION_PATTERNS = ("bidirectional", "block_causal", "causal")
NATIVE_ARCHITECTURE = "QuicksilverForDiffusionLM"
ROUTER_SCORES = ("softmax", "sigmoid")
EXPERT_BIAS_MODES = ("select", "weight")


@dataclass
class MoEConfig:
    """Mixture-of-experts feed-forward layers (models/moe.py): router, routed experts, shared expert.

    The router scores every expert (``softmax`` or ``sigmoid`` of a linear map, in fp32), optionally
    adds a learned ``expert_bias`` (``select``: the bias only chooses experts, as in DeepSeek-V3 /
    LLaDA2; ``weight``: it is added to the scores that also weight the outputs, as in LLaDA-MoE),
    optionally limits the choice to the ``topk_group`` best of ``n_group`` expert groups, takes the
    ``top_k`` best, optionally renormalises their weights to sum to 1 and scales them.
    """

    n_experts: int = 8
    top_k: int = 2
    expert_hidden: int = 128  # SwiGLU width of one routed expert
    shared_hidden: int = 0  # width of the always-on shared expert (0: none)
    # indices of the MoE layers (None: every layer); the rest are dense
    layers: list[int] | None = None
    score: str = "softmax"  # softmax | sigmoid
    norm_topk: bool = False  # renormalise the top-k weights to sum to 1 (only when top_k > 1)
    scale: float = 1.0  # routed scaling factor applied to the weights
    n_group: int = 1  # group-limited routing: experts split in n_group groups ...
    topk_group: int = 1  # ... of which the topk_group best (sum of their top-2 scores) are eligible
    expert_bias: str | None = None  # None | select | weight (see above)

    def validate(self, n_layers: int) -> None:
        if self.n_experts <= 0 or not 0 < self.top_k <= self.n_experts:
            raise ConfigError(f"moe: need 0 < top_k ({self.top_k}) <= n_experts ({self.n_experts})")
        if self.expert_hidden <= 0 or self.shared_hidden < 0:
            raise ConfigError("moe: expert_hidden must be positive and shared_hidden non-negative")
        if self.score not in ROUTER_SCORES:
            raise ConfigError(f"moe: score must be one of {ROUTER_SCORES}, got {self.score!r}")
        if self.expert_bias is not None and self.expert_bias not in EXPERT_BIAS_MODES:
            raise ConfigError(f"moe: expert_bias must be one of {EXPERT_BIAS_MODES} or null")
        if (
            self.n_group <= 0
            or self.n_experts % self.n_group
            or not 0 < self.topk_group <= self.n_group
        ):
            raise ConfigError(
                f"moe: n_group ({self.n_group}) must divide n_experts and hold topk_group "
                f"({self.topk_group}) groups"
            )
        if self.layers is not None and any(not 0 <= i < n_layers for i in self.layers):
            raise ConfigError(f"moe: layer indices {self.layers} outside 0..{n_layers - 1}")

    def is_moe_layer(self, i: int) -> bool:
        return self.layers is None or i in self.layers


@dataclass
class ModelConfig:
    """Shape and conventions of the generic transformer (see models/transformer.py)."""

    vocab_size: int = 512
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4  # grouped-query attention when < n_heads
    head_dim: int | None = None  # default d_model // n_heads
    mlp_hidden: int = 688  # SwiGLU inner width
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm on q and k per head before RoPE (Qwen3 / SDAR)
    tie_embeddings: bool = False
    attention: str = "bidirectional"  # bidirectional | block_causal | causal
    block_size: int = 32  # block length of the block_causal pattern
    logit_shift: bool = False  # Dream convention: hidden state i predicts token i+1
    mask_token_id: int = 0
    eos_token_ids: list[int] = field(default_factory=lambda: [1])
    pad_token_id: int | None = None
    architecture: str = NATIVE_ARCHITECTURE
    # Family hooks (defaults keep the plain LLaMA/Qwen network):
    partial_rotary_factor: float = 1.0  # fraction of each head that RoPE rotates (LLaDA2: 0.5)
    o_bias: bool = False  # bias on the attention output projection (LLaDA-MoE with attention_bias)
    # clamp q, k, v to [-clip, clip] after projection (LLaDA-MoE option)
    clip_qkv: float | None = None
    moe: MoEConfig | None = None  # mixture-of-experts feed-forward layers (None: dense everywhere)
    draft_length: int = 0  # causal models trained to draft k masked positions per pass (0: none)

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):
            try:
                self.moe = MoEConfig(**self.moe)
            except TypeError as e:
                raise ConfigError(f"moe: {e}") from None
        self.validate()

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """Leading dimensions of each head that RoPE rotates (the rest pass through)."""
        return int(self.dim_head * self.partial_rotary_factor)

    def validate(self) -> None:
        if self.attention not in ATTENTION_PATTERNS:
            raise ConfigError(
                f"attention must be one of {ATTENTION_PATTERNS}, got {self.attention!r}"
            )
        for name in (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "mlp_hidden",
            "max_seq_len",
            "block_size",
        ):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.dim_head % 2:
            raise ConfigError(f"head dimension must be even for RoPE, got {self.dim_head}")
        if (
            not 0.0 < self.partial_rotary_factor <= 1.0
            or self.rotary_dim % 2
            or self.rotary_dim == 0
        ):
            raise ConfigError(
                f"partial_rotary_factor {self.partial_rotary_factor} must give an even, positive "
                f"rotary width (head dimension {self.dim_head})"
            )
        if self.clip_qkv is not None and self.clip_qkv <= 0:
            raise ConfigError(f"clip_qkv must be positive, got {self.clip_qkv}")
        if self.moe is not None:
            self.moe.validate(self.n_layers)
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        if self.draft_length < 0 or (self.draft_length and self.attention != "causal"):
            raise ConfigError(
                f"draft_length ({self.draft_length}) must be >= 0, and > 0 only for causal models"
            )
        if not self.eos_token_ids:
            raise ConfigError("eos_token_ids must name at least one token")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)

    def to_hf_json(self) -> dict[str, Any]:
        """The ``config.json`` written beside our checkpoints (HF-style, dispatch on architectures)."""
        d = self.to_dict()
        arch = d.pop("architecture")
        return {
            "architectures": [arch],
            "model_type": "quicksilver",
            **d,
            "eos_token_id": self.eos_token_ids[0],
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_json(cls, d: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        try:
            arch = d["architectures"][0]
        except (KeyError, IndexError, TypeError):
            raise CheckpointError("config.json has no 'architectures' entry") from None
        kwargs = {k: v for k, v in d.items() if k in known}
        kwargs["architecture"] = arch
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise CheckpointError(f"config.json does not describe a model: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_hf_json(), indent=2) + "\n")


# Presets: small shapes for tests and benchmarks. The vocabulary size is filled in from the tokenizer.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=172, max_seq_len=512),
    "small": dict(
        d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=688, max_seq_len=1024
    ),
    "base": dict(
        d_model=384, n_layers=6, n_heads=6, n_kv_heads=6, mlp_hidden=1024, max_seq_len=1024
    ),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
