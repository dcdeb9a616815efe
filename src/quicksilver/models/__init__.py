"""Networks, configs, checkpoint loading and KV caches."""
from .config import ModelConfig, PRESETS, preset
from .kvcache import KVCache
from .transformer import DiffusionLM, Segment, build_attention_mask
from . import families  # noqa: E402,F401  (registers the open diffusion LM loaders)

__all__ = ["ModelConfig", "PRESETS", "preset", "DiffusionLM", "KVCache", "Segment", "build_attention_mask"]
