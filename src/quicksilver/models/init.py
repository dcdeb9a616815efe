"""``init-model``: a randomly initialised checkpoint in the real format (tests, benchmarks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..tokenizer import Tokenizer
from .checkpoint import save_checkpoint
from .config import ModelConfig, preset
from .transformer import Transformer


def init_model(
    out: str | Path,
    preset_name: str = "small",
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
    dtype: str = "float32",
    **overrides: Any,
) -> Path:
    tok = tokenizer or Tokenizer.byte_level()
    # pad to a multiple of 64
    vocab = overrides.pop("vocab_size", None) or (tok.vocab_size + 63) // 64 * 64
    eos = sorted({i for i in (tok.eos_id, *tok.stop_ids) if i is not None})
    assert tok.mask_id is not None
    cfg: ModelConfig = preset(
        preset_name,
        vocab_size=vocab,
        mask_token_id=tok.mask_id,
        eos_token_ids=eos,
        pad_token_id=tok.pad_id,
        **overrides,
    )
    torch.manual_seed(seed)
    model = Transformer(cfg)
    return save_checkpoint(model, tok, out, dtype=dtype)
