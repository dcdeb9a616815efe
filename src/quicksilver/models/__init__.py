"""Networks, configs, checkpoint loading and KV caches."""
from .config import ModelConfig, PRESETS, preset
from .transformer import DiffusionLM, KVCache, build_attention_mask
from . import families  # noqa: E402,F401  (registers the open diffusion LM loaders)

__all__ = ["ModelConfig", "PRESETS", "preset", "DiffusionLM", "KVCache", "build_attention_mask"]
