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

    def __post_init__(self) -> None:
        self.validate()

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    def validate(self) -> None:
        if self.attention not in ATTENTION_PATTERNS:
            raise ConfigError(f"attention must be one of {ATTENTION_PATTERNS}, got {self.attention!r}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden",
                     "max_seq_len", "block_size"):
            if int(getattr(self, name)) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.dim_head % 2:
            raise ConfigError(f"head dimension must be even for RoPE, got {self.dim_head}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ConfigError(f"mask_token_id {self.mask_token_id} outside the vocabulary")
        if not self.eos_token_ids:
            raise ConfigError("eos_token_ids must name at least one token")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown ModelConfig fields: {sorted(unknown)}")
        return cls(**d)

    def to_hf_json(self) -> dict[str, Any]:
        """The ``config.json`` written beside our checkpoints (HF-style, dispatch on architectures)."""
        d = self.to_dict()
        arch = d.pop("architecture")
        return {"architectures": [arch], "model_type": "quicksilver", **d,
                "eos_token_id": self.eos_token_ids[0], "torch_dtype": "float32"}

    @classmethod
    def from_hf_json(cls, d: dict[str, Any]) -> "ModelConfig":
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
    "small": dict(d_model=256, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=688, max_seq_len=1024),
    "base": dict(d_model=384, n_layers=6, n_heads=6, n_kv_heads=6, mlp_hidden=1024, max_seq_len=1024),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
