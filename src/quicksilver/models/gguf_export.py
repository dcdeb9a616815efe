"""``quicksilver export gguf``: a causal LLaMA/Qwen-shaped checkpoint (the AR twin, or any such model
a family loader reads) written as a GGUF file that llama.cpp and Ollama run.

The file is written with the ``gguf`` package (llama.cpp's own reader/writer); this module only maps
names and layouts. Two conversions matter: quicksilver (like Hugging Face LLaMA) rotates the two
halves of each head (NeoX RoPE), while llama.cpp's ``llama`` architecture rotates adjacent pairs, so
the rows of q/k projections are reordered per head so that both compute the same attention; and the
byte-level BPE vocabulary and merges are stored as llama.cpp's ``gpt2`` tokenizer. Only causal dense
networks are exported: a diffusion checkpoint has no llama.cpp architecture to run in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from .checkpoint import load_checkpoint
from .config import ModelConfig

DTYPES = ("f32", "f16", "bf16")
ARCH = "llama"
LAYER_NAMES = {  # quicksilver (HF-LLaMA) name inside model.layers.{i} -> GGUF name inside blk.{i}
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def check_exportable(cfg: ModelConfig) -> None:
    """Refuse what llama.cpp's ``llama`` architecture cannot run, naming the reason."""
    why = [
        (
            cfg.attention != "causal",
            f"attention is {cfg.attention!r} (only causal models run in llama.cpp)",
        ),
        (cfg.logit_shift, "logit_shift is set (a diffusion adaptation)"),
        (cfg.moe is not None, "mixture-of-experts layers"),
        (cfg.qk_norm, "qk_norm (a Qwen3-style model)"),
        (cfg.partial_rotary_factor != 1.0, "partial rotary embeddings"),
        (cfg.o_bias or cfg.clip_qkv is not None, "an output-projection bias or qkv clipping"),
    ]
    for bad, reason in why:
        if bad:
            raise ConfigError(f"cannot export to GGUF: {reason}")


def neox_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the output rows of a q/k projection (out, in) or bias (out,) per head from halves
    (x_i, x_{i+d/2}) to adjacent pairs (x_{2i}, x_{2i+1}), the rotation llama.cpp's llama applies."""
    hd = w.shape[0] // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, hd // 2, *rest).transpose(1, 2).reshape(w.shape)


def gguf_tensors(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The state dict under GGUF names and layouts (float32)."""
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        t = t.detach().float().cpu()
        if key in TOP_NAMES:
            out[TOP_NAMES[key]] = t
            continue
        parts = key.split(".", 3)  # model, layers, i, rest
        if len(parts) != 4 or parts[:2] != ["model", "layers"] or parts[3] not in LAYER_NAMES:
            raise ConfigError(f"cannot export to GGUF: unexpected tensor {key!r}")
        name = LAYER_NAMES[parts[3]]
        if name.startswith("attn_q"):
            t = neox_to_interleaved(t, cfg.n_heads)
        elif name.startswith("attn_k"):
            t = neox_to_interleaved(t, cfg.n_kv_heads)
        out[f"blk.{parts[2]}.{name}"] = t
    if cfg.tie_embeddings:
        out.pop("output.weight", None)  # llama.cpp reuses token_embd
    return out


def vocabulary(
    tokenizer_json: dict[str, Any], n_vocab: int, special: set[int]
) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, token types, merges) of a byte-level BPE ``tokenizer.json``, padded
    with unused entries up to the embedding's rows."""
    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ConfigError(
            f"cannot export to GGUF: a {model.get('type')} tokenizer (need byte-level BPE)"
        )
    by_id = {i: t for t, i in model["vocab"].items()}
    for added in tokenizer_json.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    if len(by_id) > n_vocab:
        raise ConfigError(
            f"cannot export to GGUF: {len(by_id)} tokens but {n_vocab} embedding rows"
        )
    tokens, types = [], []
    for i in range(n_vocab):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        types.append(3 if i in special else 1 if i in by_id else 5)  # control / normal / unused
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    if not merges:
        raise ConfigError(
            "cannot export to GGUF: the tokenizer has no BPE merges (llama.cpp needs them)"
        )
    return tokens, types, merges


def add_body(w: Any, cfg: ModelConfig) -> None:
    """The network's shape in a ``gguf.GGUFWriter``'s metadata, and a byte-level BPE tokenizer
    with Qwen2's pre-tokenizer (digits one by one, as quicksilver's splits them)."""
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.mlp_hidden)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.dim_head)
    w.add_value_length(cfg.dim_head)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")


def export_gguf(model_dir: str | Path, out: str | Path, dtype: str = "f32") -> dict[str, Any]:
    """Write ``model_dir`` as a GGUF file; returns a summary."""
    import gguf

    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model, tok = load_checkpoint(model_dir)
    cfg = model.config
    check_exportable(cfg)
    tensors = gguf_tensors(model.state_dict(), cfg)
    special = {i for i in (tok.eos_id, tok.pad_id, tok.mask_id, tok.bos_id) if i is not None}
    tokens, types, merges = vocabulary(json.loads(tok.fast.to_str()), cfg.vocab_size, special)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name(Path(model_dir).name)
    add_body(w, cfg)
    w.add_rope_dimension_count(cfg.dim_head)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    for eos in cfg.eos_token_ids[:1]:
        w.add_eos_token_id(eos)
    if tok.pad_id is not None:
        w.add_pad_token_id(tok.pad_id)
    w.add_add_bos_token(False)
    template = tok.config.get("chat_template")
    if isinstance(template, str):
        w.add_chat_template(template)
    kinds = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
    }
    for name, t in tensors.items():
        arr = t.numpy().astype(np.float32)
        kind = kinds[dtype] if arr.ndim == 2 else gguf.GGMLQuantizationType.F32  # norms stay f32
        data = gguf.quants.quantize(arr, kind) if kind != gguf.GGMLQuantizationType.F32 else arr
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {
        "out": str(out),
        "architecture": ARCH,
        "dtype": dtype,
        "tensors": len(tensors),
        "parameters": sum(t.numel() for t in tensors.values()),
        "bytes": out.stat().st_size,
    }
