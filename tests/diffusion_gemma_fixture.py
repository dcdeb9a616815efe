"""A tiny DiffusionGemma checkpoint written by hand in ``save_pretrained``'s layout (no transformers
5 needed): ``config.json`` with a ``text_config`` (sliding and full layers, MoE top-2 of 4, full
layers with their own head dim and KV heads in ``per_layer_config``), random weights under
transformers' tensor names (``model.decoder.*`` and the encoder's own ``layer_scalar`` buffers),
a ``generation_config.json`` with the published keys, and the shipped model's tokenizer (vocab
1024) with its ChatML template moved to ``chat_template.jinja`` and no mask token.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

import quicksilver
from quicksilver.models.families.diffusion_gemma import DECODER, ENCODER, gemma_config
from quicksilver.models.families.diffusion_gemma_net import expected_names

SHIPPED = Path(quicksilver.__file__).parent / "assets" / "model"  # its tokenizer files
CANVAS = 16
STEPS = 6  # max_denoising_steps: keeps the tests fast
TEXT_CONFIG: dict[str, Any] = {
    "attention_bias": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "head_dim": 8,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 32,
    "intermediate_size": 40,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 2048,
    "model_type": "diffusion_gemma_text",
    "moe_intermediate_size": 12,
    "num_attention_heads": 4,
    "num_experts": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "pad_token_id": 0,
    "per_layer_config": {"2": {"head_dim": 16, "num_key_value_heads": 1}},
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "sliding_window": 8,
    "tie_word_embeddings": True,
    "top_k_experts": 2,
    "use_bidirectional_attention": None,
    "vocab_size": 1024,
}
GENERATION_CONFIG: dict[str, Any] = {
    "max_new_tokens": 256,
    "max_denoising_steps": STEPS,
    "sampler_config": {"entropy_bound": 0.1},
    "t_min": 0.4,
    "t_max": 0.8,
    "stability_threshold": 1,
    "confidence_threshold": 0.005,
    "eos_token_id": [1, 4],  # <|endoftext|>, <|im_end|> (the end of a turn)
    "pad_token_id": 0,
}


def _random(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if name.endswith("layer_scalar"):
        return 0.5 + torch.rand(shape, generator=g)
    if name.endswith(("norm.weight", "router.scale", "per_expert_scale")):
        return 1.0 + 0.3 * torch.randn(shape, generator=g)
    return 0.15 * torch.randn(shape, generator=g)


def checkpoint_name(ours: str) -> str:
    """Our tensor name -> the one ``save_pretrained`` writes."""
    if ours.endswith("encoder_layer_scalar"):
        return ENCODER + ours.replace("encoder_layer_scalar", "layer_scalar")
    return DECODER + ours


def write_tiny_diffusion_gemma(path: Path, seed: int = 0, template: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "canvas_length": CANVAS,
        "dtype": "float32",
        "model_type": "diffusion_gemma",
        "text_config": TEXT_CONFIG,
        "tie_word_embeddings": True,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 16},
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2))
    g = torch.Generator().manual_seed(seed)
    shapes = expected_names(gemma_config(path, config))
    state = {checkpoint_name(k): _random(k, s, g) for k, s in sorted(shapes.items())}
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    shipped = SHIPPED
    shutil.copy(shipped / "tokenizer.json", path / "tokenizer.json")
    tc = json.loads((shipped / "tokenizer_config.json").read_text())
    chat = tc.pop("chat_template")
    tc.pop("mask_token")
    (path / "tokenizer_config.json").write_text(json.dumps(tc, indent=2))
    if template:
        (path / "chat_template.jinja").write_text(chat)
    return path
