"""Networks, configs, checkpoint loading and KV caches."""
from .config import ModelConfig, PRESETS, preset
from .kvcache import KVCache
from .transformer import DiffusionLM, Segment, build_attention_mask

__all__ = ["ModelConfig", "PRESETS", "preset", "DiffusionLM", "KVCache", "Segment", "build_attention_mask"]
