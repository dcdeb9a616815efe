"""Parity of DiffusionGemma's network with ``transformers``' own ``DiffusionGemmaForBlockDiffusion``.

Tiny random checkpoints are built with transformers' config and model classes and written with
``save_pretrained`` into tmp_path; quicksilver loads them (families/diffusion_gemma.py) and must
give the same encoder-pass and decoder-pass logits (within 1e-4) over a sequence of calls on one
KV cache, each pass fed the same inputs as transformers' (its logits condition the next step): the prompt's encoder pass (longer than the sliding window), a decoder pass on a canvas
without self-conditioning, one with the previous logits as self-conditioning (masked off for one
row), the encoder pass of a finished canvas appended to the cache, and a decoder pass after it.

Every weight is drawn at random, norms, router scales, per-expert scales and the layer scalars
included (the encoder's layer scalars differ from the decoder's), so none of them can be skipped
unnoticed. DiffusionGemma's layers always run a dense MLP beside the experts; the "dense" case is
one expert that every token takes (top-1 of 1).

Needs transformers >= 5.11 (``models/diffusion_gemma``; the dev extra pins >= 5.23); skips
where an older one is installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.diffusion_gemma")

from quicksilver.errors import CheckpointError  # noqa: E402
from quicksilver.models.families.diffusion_gemma import gemma_config, load_network  # noqa: E402
from quicksilver.models.families.diffusion_gemma_net import GemmaKVCache  # noqa: E402

TOL = 1e-4
VISION = dict(
    hidden_size=16,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
)
BASE: dict[str, Any] = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=40,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
    moe_intermediate_size=12,
)
SHAPES: dict[str, dict[str, Any]] = {
    # sliding and full layers, MoE top-2 of 4, full layers with their own head dim and one KV head
    "moe": dict(
        num_hidden_layers=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        sliding_window=4,
        num_experts=4,
        top_k_experts=2,
        global_head_dim=16,
        num_global_key_value_heads=1,
    ),
    # one expert that every token takes; full layers keep the sliding layers' KV heads; RoPE
    # rotating half of the full layers' frequencies
    "dense": dict(
        num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        sliding_window=5,
        num_experts=1,
        top_k_experts=1,
        global_head_dim=12,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.5,
                "rope_theta": 1_000_000.0,
            },
        },
    ),
    # full attention only (the last layer is always full)
    "full_only": dict(
        num_hidden_layers=2,
        layer_types=["full_attention", "full_attention"],
        sliding_window=8,
        num_experts=3,
        top_k_experts=2,
        global_head_dim=8,
        num_global_key_value_heads=4,
    ),
}


def write_reference(shape: str, path: Path, seed: int = 0) -> torch.nn.Module:
    """transformers' model with every weight random, saved with ``save_pretrained`` to ``path``."""
    torch.manual_seed(seed)
    cfg = transformers.DiffusionGemmaConfig(
        text_config={**BASE, **SHAPES[shape]}, vision_config=VISION, canvas_length=8
    )
    ref = transformers.DiffusionGemmaForBlockDiffusion(cfg).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith("norm.weight") or name.endswith(("router.scale", "per_expert_scale")):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
        for name, b in ref.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand_like(b))
    ref.save_pretrained(path)
    return ref


def softcapped(ref: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    logits = ref.lm_head(hidden).float()  # (B, T, V)
    cap = ref.final_logit_softcapping
    return torch.tanh(logits / cap) * cap


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, what
    err = (a - b).abs().max().item()
    assert err < TOL, f"{what}: max |diff| {err:.3g}"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_encoder_and_decoder_passes_match_transformers(tmp_path: Path, shape: str) -> None:
    ref = write_reference(shape, tmp_path)
    net = load_network(tmp_path)
    g = torch.Generator().manual_seed(1)
    V, B = BASE["vocab_size"], 2
    prompt = torch.randint(0, V, (B, 7), generator=g)  # longer than every sliding window but one
    canvas = torch.randint(0, V, (B, 8), generator=g)
    cache_ref = transformers.DynamicCache(config=ref.config.text_config)
    cache = GemmaKVCache()
    with torch.no_grad():
        # 1. the prompt's encoder pass (writes the cache) and a decoder pass on the canvas
        out = ref(input_ids=prompt, decoder_input_ids=canvas, past_key_values=cache_ref)
        close(net.encode(prompt, cache), softcapped(ref, out.encoder_last_hidden_state), "encoder")
        first = net.decode(canvas, cache)
        close(first, out.logits, "decoder, no self-conditioning")
        assert cache.length == 7
        # 2. the next step: the previous logits as self-conditioning, off for the second row
        sc_mask = torch.tensor([True, False])
        canvas2 = torch.randint(0, V, (B, 8), generator=g)
        out2 = ref(
            decoder_input_ids=canvas2,
            past_key_values=cache_ref,
            self_conditioning_logits=out.logits,
            self_conditioning_mask=sc_mask,
        )
        # each pass gets the same inputs as transformers' (its logits, not ours, condition the next)
        second = net.decode(canvas2, cache, out.logits, sc_mask)
        close(second, out2.logits, "decoder, self-conditioning")
        assert cache.length == 7  # the decoder never writes
        # 3. a finished canvas appended by the encoder, then the next canvas decoded after it
        done = out2.logits.argmax(-1)  # (B, 8)
        canvas3 = torch.randint(0, V, (B, 8), generator=g)
        out3 = ref(
            input_ids=done,
            decoder_input_ids=canvas3,
            past_key_values=cache_ref,
            self_conditioning_logits=out2.logits,
        )
        close(net.encode(done, cache), softcapped(ref, out3.encoder_last_hidden_state), "encoder 2")
        third = net.decode(canvas3, cache, out2.logits)
        close(third, out3.logits, "decoder after 2 encoder passes")
        assert cache.length == 15


def test_config_mapping(tmp_path: Path) -> None:
    write_reference("moe", tmp_path)
    cj = json.loads((tmp_path / "config.json").read_text())
    assert cj["architectures"] == ["DiffusionGemmaForBlockDiffusion"]
    cfg = gemma_config(tmp_path, cj)
    assert (cfg.sliding.head_dim, cfg.sliding.n_kv_heads) == (8, 2)
    assert (cfg.full.head_dim, cfg.full.n_kv_heads) == (16, 1)
    assert cfg.full.rope_type == "proportional" and cfg.full.partial_rotary_factor == 0.25
    assert cfg.final_logit_softcapping == 30.0 and cfg.canvas_length == 8
    assert cfg.n_experts == 4 and cfg.top_k == 2 and cfg.expert_hidden == 12
    # the same shape written by hand (global_head_dim instead of per_layer_config)
    tc = {k: v for k, v in cj["text_config"].items() if k != "per_layer_config"}
    hand = {**cj, "text_config": {**tc, "global_head_dim": 16, "num_global_key_value_heads": 1}}
    assert gemma_config(tmp_path, hand) == cfg
    with pytest.raises(CheckpointError, match="untied"):
        gemma_config(tmp_path, {**cj, "tie_word_embeddings": False})
    with pytest.raises(CheckpointError, match="use_bidirectional_attention"):
        gemma_config(tmp_path, {**cj, "text_config": {**tc, "use_bidirectional_attention": "all"}})
