"""Speed of DiffusionGemma's published shape (26B-A4B) with RANDOM weights: ``bench families
--shapes diffusiongemma-26b-a4b``.

The shape is the text network of ``google/diffusiongemma-26B-A4B-it`` (Gemma-4 26B-A4B's
``text_config``: hidden 2816, 30 layers 5:1 sliding/full, 16 query heads, 8 KV heads of 256 on
sliding layers and 2 of 512 on full ones, a 2112-wide dense MLP beside 128 experts of 704 with top-8
routing, vocabulary 262,144, sliding window 1,024), mapped through the family loader's
``gemma_config`` so the network is the one a real checkpoint would get. About 26B parameters: ~52
GB in bf16, which fits one H200. ``--layers N`` keeps the first N layers (the last one forced to
full attention, as the config class does) at the real widths, embedding and head included: the
CPU slice. Sources for the numbers: the Gemma-4 26B-A4B ``config.json`` as mirrored in public test
fixtures (two independent ones agree) and the DiffusionGemma generation defaults in transformers
5.23.

For each batch size it times, against a prompt of ``--context`` tokens already encoded:

- ``decode_fwd_per_s``: decoder passes per second over one canvas (``canvas_length`` 256) with
  self-conditioning logits (every step after a canvas's first has them);
- ``encode_fwd_per_s``: encoder passes per second over one finished canvas (written to the cache);
- ``loop_tok_s_per_request``: the real generation loop (sampling/decoders/noise_canvas.py, sampling and
  entropy-bound acceptance included) at the published vLLM setting, ``max_denoising_steps`` 16 and
  no adaptive stop: 256 tokens per 16 decoder passes + 1 encoder pass;
- ``projected_tok_s_per_request``: 256 / (16 / decode rate + 1 / encode rate), the same figure
  from the pass rates alone;
- ``default_tok_s_per_request``: one canvas at the family's default decoding (48 steps, adaptive
  stop, which random weights never meet);
- ``peak_memory_bytes``: the device's peak over the row (reset before it); a row that runs out of
  memory is recorded with its ``error``, and the next batch size still runs.

vLLM publishes 1,756 tok/s at batch 1 on an H100 in FP8 with 16.02 tokens per denoising step
(families_2026 reference): that is the number to set the GPU row beside. Random weights give no
quality and no real early stopping, so every canvas runs all 16 steps.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..models.families.diffusion_gemma import ARCHITECTURE, gemma_config
from ..models.families.diffusion_gemma_net import FULL, DiffusionGemmaLM, GemmaKVCache
from ..sampling.decoders.noise_canvas import NoiseCanvasConfig, generate
from .common import calls_per_second, sync

SHAPE = "diffusiongemma-26b-a4b"
TEXT_26B_A4B: dict[str, Any] = {
    "vocab_size": 262144,
    "hidden_size": 2816,
    "intermediate_size": 2112,
    "moe_intermediate_size": 704,
    "num_experts": 128,
    "top_k_experts": 8,
    "num_hidden_layers": 30,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 2,
    "sliding_window": 1024,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
}
TINY_TEXT: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "top_k_experts": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_global_key_value_heads": 1,
    "sliding_window": 32,
    "max_position_embeddings": 4096,
    "num_hidden_layers": 2,
}
CANVAS, STEPS = 256, 16  # vLLM's published --diffusion-config
VLLM_H100_FP8_TOK_S = 1756.0  # batch 1, vLLM PR #45163 / its 2026-06-10 blog


def shape_config(tiny: bool, layers: int | None) -> dict[str, Any]:
    """The ``config.json`` dict of the shape (``layers``: the first N layers only)."""
    text = {**TEXT_26B_A4B, **(TINY_TEXT if tiny else {})}
    n = layers or text["num_hidden_layers"]
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types[-1] = "full_attention"
    text = {**text, "num_hidden_layers": n, "layer_types": types}
    return {"architectures": [ARCHITECTURE], "text_config": text, "canvas_length": CANVAS}


def random_network(
    cj: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0
) -> DiffusionGemmaLM:
    """The network with random N(0, 0.02) weights (norm scales 1) made directly on the device."""
    cfg = gemma_config(Path(f"<{SHAPE} config.json>"), cj)
    with torch.device("meta"):
        net = DiffusionGemmaLM(cfg)
    net = net.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 1:  # norm scales, router scales
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for name, b in net.named_buffers():
            if name.endswith("layer_scalar"):
                b.fill_(1.0)
    net.reset_rope(device)
    return net.to(dtype).eval()


def _prompt_cache(
    net: DiffusionGemmaLM, batch: int, context: int, device: torch.device
) -> GemmaKVCache:
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, net.config.vocab_size, (batch, context), generator=gen).to(device)
    cache = GemmaKVCache()
    net.encode(ids, cache)  # (B, P) -> the prompt's keys and values
    return cache


def peak_bytes(device: torch.device) -> int | None:
    """The device's peak allocation since the last reset (None on the CPU)."""
    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


@torch.no_grad()
def timed_loop(
    net: DiffusionGemmaLM, prompt: torch.Tensor, cfg: NoiseCanvasConfig, device: torch.device
) -> tuple[int, float]:
    """New tokens per row and seconds of ``generate`` over ``prompt`` (B, P) under ``cfg``."""
    g = torch.Generator(device=device).manual_seed(0)
    sync(device)
    t0 = time.perf_counter()
    res = generate(net, prompt, cfg, g)
    sync(device)
    return int(res.new_tokens.shape[1]), time.perf_counter() - t0


def guarded_row(
    net: DiffusionGemmaLM, batch: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """``bench_row`` with the device's peak reset first; running out of memory is a row too."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        return bench_row(net, batch, args, device)
    except torch.OutOfMemoryError as e:
        return {
            "batch": batch,
            "error": f"OutOfMemoryError: {e}"[:300],
            "peak_memory_bytes": peak_bytes(device),
        }


@torch.no_grad()
def bench_row(
    net: DiffusionGemmaLM, batch: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    C, V = net.config.canvas_length, net.config.vocab_size
    cache = _prompt_cache(net, batch, args.context, device)
    gen = torch.Generator().manual_seed(7)
    canvas = torch.randint(0, V, (batch, C), generator=gen).to(device)  # (B, C)
    sc = net.decode(canvas, cache)  # (B, C, V): the self-conditioning of the timed passes
    t_dec = 1 / calls_per_second(lambda: net.decode(canvas, cache, sc), device, args.iters, 1)
    length = cache.length

    def encode_canvas() -> None:
        net.encode(canvas, cache)
        for i in range(len(cache.k)):  # drop what it appended: the cache stays the prompt's
            cache.k[i], cache.v[i] = cache.k[i][:, :, :length], cache.v[i][:, :, :length]
        cache.length = length

    t_enc = 1 / calls_per_second(encode_canvas, device, max(1, args.iters // 2), 1)
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, V, (batch, args.context), generator=gen).to(device)  # (B, P)
    published = NoiseCanvasConfig(
        max_new_tokens=C * args.canvases,
        max_denoising_steps=STEPS,
        stability_threshold=None,
        confidence_threshold=None,
    )
    new, loop_s = timed_loop(net, prompt, published, device)
    default_new, default_s = timed_loop(net, prompt, NoiseCanvasConfig(max_new_tokens=C), device)
    projected = C / (STEPS * t_dec + t_enc)
    row = {
        "batch": batch,
        "context": args.context,
        "canvas": C,
        "steps_per_canvas": STEPS,
        "decode_fwd_per_s": round(1 / t_dec, 2),
        "encode_fwd_per_s": round(1 / t_enc, 2),
        "projected_tok_s_per_request": round(projected, 1),
        "projected_tok_s_aggregate": round(projected * batch, 1),
        "loop_tok_s_per_request": round(new / loop_s, 1),
        "loop_tok_s_aggregate": round(batch * new / loop_s, 1),
        "loop_seconds": round(loop_s, 3),
        "loop_tokens": new,
        # the family's default decoding (48 steps, adaptive stop: random weights never settle)
        "default_tok_s_per_request": round(default_new / default_s, 1),
        "default_tok_s_aggregate": round(batch * default_new / default_s, 1),
        "peak_memory_bytes": peak_bytes(device),
    }
    print(
        f"{SHAPE} batch {batch}: {1 / t_dec:7.2f} decoder passes/s, {1 / t_enc:7.2f} encoder "
        f"passes/s; {new / loop_s:8.1f} tok/s per request in the loop (16 steps a canvas)",
        file=sys.stderr,
    )
    return row


def bench_gemma(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    """One ``bench families`` result for the DiffusionGemma shape (rows per batch size)."""
    cj = shape_config(args.tiny, args.layers)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    net = random_network(cj, device, dtype)
    build_s = time.perf_counter() - t0
    rows = [guarded_row(net, b, args, device) for b in args.batch]
    n_full = sum(t == FULL for t in net.config.layer_types)
    out = {
        "shape": SHAPE,
        "architecture": ARCHITECTURE,
        "layers": net.config.n_layers,
        "full_attention_layers": n_full,
        "parameters": net.num_params(),
        "config": copy.deepcopy(cj["text_config"]),
        "dtype": str(dtype),
        "build_seconds": round(build_s, 2),
        "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device))
        if device.type == "cuda"
        else None,
        "rows": rows,
        "vllm_published_tok_s": {"tok_s": VLLM_H100_FP8_TOK_S, "batch": 1, "device": "H100, FP8"},
    }
    if args.layers:
        out["note"] = (
            f"a {args.layers}-layer slice at the real widths (embedding and head included): "
            "pass times grow about linearly with the layer count"
        )
    del net
    return out
