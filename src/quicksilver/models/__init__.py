"""Networks, configs, checkpoint loading and KV caches."""

from . import families  # noqa: E402,F401  (registers the open diffusion LM loaders)
from .config import PRESETS, ModelConfig, preset
from .kvcache import KVCache
from .masks import build_attention_mask
from .transformer import Transformer

__all__ = [
    "ModelConfig",
    "PRESETS",
    "preset",
    "Transformer",
    "KVCache",
    "Segment",
    "build_attention_mask",
]
