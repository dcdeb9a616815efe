"""Checkpoint directories: HF-style ``config.json`` + ``model.safetensors`` + tokenizer files.

Loading dispatches on ``config.json``'s ``architectures`` through a registry of loaders (our own
format here; the open diffusion LMs register theirs). Nothing is ever downloaded.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import CheckpointError
from ..tokenizer import Tokenizer
from .config import NATIVE_ARCHITECTURE, ModelConfig
from .transformer import DiffusionLM

# architecture name -> function(path, config.json dict) -> (ModelConfig, state dict in our names)
Loader = Callable[[Path, dict], tuple[ModelConfig, dict[str, torch.Tensor]]]
LOADERS: dict[str, Loader] = {}

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def register_loader(*architectures: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        for a in architectures:
            LOADERS[a] = fn
        return fn
    return deco


def read_config_json(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint must be a directory")
    cj = path / "config.json"
    if not cj.is_file():
        raise CheckpointError(f"{path}: missing config.json")
    try:
        d = json.loads(cj.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cj}: invalid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{cj}: expected a JSON object")
    return d


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a directory: ``model.safetensors`` or shards listed in an index (memory-mapped)."""
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    try:
        if single.is_file():
            return load_file(str(single))
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            out: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                out.update(load_file(str(path / shard)))
            return out
    except (SafetensorError, OSError, KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable weights ({str(e).splitlines()[0]})") from None
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


@register_loader(NATIVE_ARCHITECTURE)
def _load_native(path: Path, cj: dict) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    return ModelConfig.from_hf_json(cj), read_safetensors(path)


def build_model(cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> DiffusionLM:
    model = DiffusionLM(cfg)
    if cfg.tie_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    expected = {k for k in model.state_dict() if not (cfg.tie_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"weights do not match the config: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    target = dtype or torch.float32
    with torch.no_grad():
        params = dict(model.named_parameters())
        for k, v in state.items():
            if params[k].shape != v.shape:
                raise CheckpointError(f"{k}: shape {tuple(v.shape)} in the checkpoint, {tuple(params[k].shape)} in the config")
            params[k].copy_(v.to(params[k].dtype))
    return model.to(target).eval()


def load_checkpoint(path: str | Path, dtype: torch.dtype | None = None) -> tuple[DiffusionLM, Tokenizer]:
    path = Path(path)
    cj = read_config_json(path)
    archs = cj.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise CheckpointError(f"{path}/config.json: no 'architectures' list")
    loader = LOADERS.get(archs[0])
    if loader is None:
        raise CheckpointError(f"{path}: unsupported architecture {archs[0]!r} (known: {sorted(LOADERS)})")
    tokenizer = Tokenizer.from_dir(path)
    cfg, state = loader(path, cj)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens, model only {cfg.vocab_size}")
    return build_model(cfg, state, dtype), tokenizer


def save_checkpoint(model: DiffusionLM, tokenizer: Tokenizer, path: str | Path, dtype: str = "float32",
                    extra: dict[str, dict] | None = None) -> Path:
    """Write a checkpoint directory; ``extra`` adds JSON files (e.g. ``{"train_config": {...}}``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    state = {k: v.detach().to(DTYPES[dtype]).contiguous() for k, v in model.state_dict().items()
             if not (cfg.tie_embeddings and k == "lm_head.weight")}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    hf = cfg.to_hf_json()
    hf["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    tokenizer.save(path)
    for name, obj in (extra or {}).items():
        (path / f"{name}.json").write_text(json.dumps(obj, indent=2) + "\n")
    return path
