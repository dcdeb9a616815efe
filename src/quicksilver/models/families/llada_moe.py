"""The mixture-of-experts diffusion LMs of inclusionAI: LLaDA-MoE (bidirectional) and LLaDA2.x (block-causal).

LLaDA-MoE-7B-A1B (its config.json and remote code, huggingface.co/inclusionAI/LLaDA-MoE-7B-A1B-Instruct): architecture ``LLaDAMoEModelLM`` (its
``model_type`` is "llada", like the dense model: dispatch is on ``architectures``). OLMoE-like:
Qwen-style names, QK-norm over head_dim before RoPE, optional ``clip_qkv``, ``o_proj`` bias =
``attention_bias``; per layer ``moe_layer_freq[i]`` picks a sparse block (1) or a dense MLP of
``dense_intermediate_size`` (0). Router: softmax, top-k, no renormalisation (hard-coded in the
reference), an optional ``expert_bias`` added to the scores that also weight the experts; an
optional shared expert at ``model.layers.{i}.shared_expert``. No logit shift, no causal mask.

LLaDA2.0 / 2.1 (§3.2): architecture ``LLaDA2MoeModelLM``; Ling-2.0 names (``word_embeddings``,
fused ``attention.query_key_value`` split q, k, v; ``attention.dense``; ``query_layernorm`` /
``key_layernorm``); partial RoPE (``partial_rotary_factor`` 0.5); the first
``first_k_dense_replace`` layers dense; sigmoid router with a selection-only ``expert_bias``,
group-limited top-k, renormalised, times ``routed_scaling_factor``; shared experts. Attention is
block-causal in blocks of 32 (``generate(block_length=32)``), so the KV cache is exact. Decoding
as published: threshold 0.95 within each block, at least one token per step.

LLaDA2.1 (arXiv 2602.08676) is the same architecture and config; it adds token-to-token editing
(``SamplerConfig.editing_threshold``) in two published modes: quality (threshold 0.7, editing 0.5)
and speed (threshold 0.5, editing 0.0: rewrite wherever the top token differs), 16 post passes
at most. Nothing in config.json tells 2.1 from 2.0, so a checkpoint decodes in quality mode when
its name says 2.1 (``is_llada21``): the directory path (a Hub cache path holds
``models--inclusionAI--LLaDA2.1-mini``) or config.json's ``_name_or_path``.

Both: mask ``<|mask|>`` 156895, eos = pad 156892, end of turn ``<|role_end|>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError
from ..checkpoint import State, read_safetensors
from ..config import ModelConfig, MoEConfig
from ..lazy_state import LazyState
from .common import Fields, fast_tokenizer_loader, make_config, rename, token_id
from .registry import Family, register_family

MASK_TOKEN, MASK_ID = "<|mask|>", 156895
EOS_ID = 156892
EOT_TOKEN = "<|role_end|>"
LLADA2_BLOCK = 32


def _common(path: Path, cj: dict, f: Fields) -> dict:
    n_heads = f.int("num_attention_heads")
    eos = f.ids("eos_token_id", EOS_ID)
    if cj.get("rope_scaling"):
        raise CheckpointError(
            f"{path}/config.json: rope_scaling {cj['rope_scaling']!r} is not supported"
        )
    prf = f.float("partial_rotary_factor", 1.0)  # a factor outside (0, 1] is refused by ModelConfig
    return dict(
        vocab_size=f.int("vocab_size"),
        d_model=f.int("hidden_size"),
        n_layers=f.int("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=f.int("num_key_value_heads", n_heads),
        head_dim=f.int("head_dim", None),
        max_seq_len=f.int("max_position_embeddings", 8192),
        rope_theta=f.float("rope_theta", 10000.0),
        norm_eps=f.float("rms_norm_eps", 1e-6),
        tie_embeddings=f.bool("tie_word_embeddings", False),
        partial_rotary_factor=prf,
        eos_token_ids=eos,
        pad_token_id=f.int("pad_token_id", eos[0]),
        mask_token_id=token_id(path, f, "mask_token_id", MASK_TOKEN, MASK_ID),
        architecture=cj["architectures"][0],
    )


# ---- LLaDA-MoE --------------------------------------------------------------------------------
LLADA_MOE_RENAMES = [
    (
        r"model\.layers\.(\d+)\.shared_expert\.(\w+)\.weight",
        r"model.layers.\1.mlp.shared_experts.\2.weight",
    ),
    (r"model\.layers\.(\d+)\.mlp\.expert_bias", r"model.layers.\1.mlp.gate.expert_bias"),
]


def load_llada_moe(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    f = Fields(path, cj, "LLaDA-MoE")
    n_layers = f.int("num_hidden_layers")
    freq = f.list("moe_layer_freq", None)
    if freq is None:
        freq = [1] * n_layers
    if len(freq) != n_layers or any(v not in (0, 1) for v in freq):
        raise CheckpointError(
            f"{path}/config.json: moe_layer_freq must list 0 or 1 for each of {n_layers} layers"
        )
    shared = f.int("shared_expert_intermediate_size", None)
    moe = MoEConfig(
        n_experts=f.int("num_experts"),
        top_k=f.int("num_experts_per_tok"),
        expert_hidden=f.int("expert_intermediate_size"),
        shared_hidden=shared if shared and shared > 0 else 0,
        layers=[i for i, v in enumerate(freq) if v],
        score="softmax",
        norm_topk=False,
        expert_bias="weight" if f.bool("moe_router_enable_expert_bias", False) else None,
    )
    attn_bias = bool(f.bool("attention_bias", False))
    dense = f.int("dense_intermediate_size", None)
    cfg = make_config(
        path,
        **_common(path, cj, f),
        mlp_hidden=dense if dense and dense > 0 else moe.expert_hidden,
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        qk_norm=bool(f.bool("qk_layernorm", False)),
        clip_qkv=f.float("clip_qkv", None),
        attention="bidirectional",
        logit_shift=False,
        moe=moe,
    )
    return cfg, rename(read_safetensors(path), LLADA_MOE_RENAMES)


# ---- LLaDA2.x ---------------------------------------------------------------------------------
LLADA2_RENAMES = [
    (r"model\.word_embeddings\.weight", r"model.embed_tokens.weight"),
    (
        r"model\.layers\.(\d+)\.attention\.dense\.(weight|bias)",
        r"model.layers.\1.self_attn.o_proj.\2",
    ),
    (
        r"model\.layers\.(\d+)\.attention\.query_layernorm\.weight",
        r"model.layers.\1.self_attn.q_norm.weight",
    ),
    (
        r"model\.layers\.(\d+)\.attention\.key_layernorm\.weight",
        r"model.layers.\1.self_attn.k_norm.weight",
    ),
]


def split_lazy_qkv(state: LazyState, sizes: list[int]) -> LazyState:
    """``split_fused_qkv`` of a lazy state: each part a run of rows of the fused tensor, unread."""
    for name in [n for n in state if ".attention.query_key_value." in n]:
        rows = state.shape(name)[0]
        if rows != sum(sizes):
            raise CheckpointError(
                f"{name}: {rows} rows, expected (n_heads + 2 n_kv_heads) * head_dim = {sum(sizes)}"
            )
        prefix, kind = name.split(".attention.query_key_value.")
        bounds = [0, sizes[0], sizes[0] + sizes[1], rows]
        parts = {
            f"{prefix}.self_attn.{p}_proj.{kind}": (bounds[j], bounds[j + 1])
            for j, p in enumerate("qkv")
        }
        state = state.split_rows(name, parts)
    return state


def split_fused_qkv(state: State, cfg: ModelConfig) -> State:
    """``attention.query_key_value`` ((nq + 2 nkv) * hd, C) -> q_proj, k_proj, v_proj (in that order)."""
    hd, nq, nkv = cfg.dim_head, cfg.n_heads, cfg.n_kv_heads
    sizes = [nq * hd, nkv * hd, nkv * hd]
    if isinstance(state, LazyState):
        return split_lazy_qkv(state, sizes)
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if ".attention.query_key_value." not in name:
            out[name] = t
            continue
        if t.shape[0] != sum(sizes):
            raise CheckpointError(
                f"{name}: {t.shape[0]} rows, expected (n_heads + 2 n_kv_heads) * head_dim = {sum(sizes)}"
            )
        prefix, kind = name.split(".attention.query_key_value.")
        for proj, part in zip("qkv", t.split(sizes, dim=0)):  # (nq*hd | nkv*hd | nkv*hd, C)
            out[f"{prefix}.self_attn.{proj}_proj.{kind}"] = part
    return out


def load_llada2(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    state = rename(read_safetensors(path), LLADA2_RENAMES)
    cfg = llada2_config(path, cj, list(state))
    return cfg, split_fused_qkv(state, cfg)


def llada2_config(path: Path, cj: dict, names: list[str]) -> ModelConfig:
    """The ModelConfig of a LLaDA2.x ``config.json`` whose tensors (renamed) are ``names``: the
    biases are as the checkpoint holds them (the config class defaults use_bias to True)."""
    f = Fields(path, cj, "LLaDA2")
    n_layers = f.int("num_hidden_layers")
    score = f.str("score_function", "sigmoid")
    if score != "sigmoid":
        raise CheckpointError(
            f"{path}/config.json: score_function {score!r} is not supported (LLaDA2 uses sigmoid)"
        )
    n_shared = f.int("num_shared_experts", 0) or 0
    moe = MoEConfig(
        n_experts=f.int("num_experts"),
        top_k=f.int("num_experts_per_tok"),
        expert_hidden=f.int("moe_intermediate_size"),
        shared_hidden=f.int("moe_intermediate_size") * n_shared,
        layers=list(range(f.int("first_k_dense_replace", 0), n_layers)),
        score="sigmoid",
        norm_topk=bool(f.bool("norm_topk_prob", True)),
        scale=f.float("routed_scaling_factor", 1.0),
        n_group=f.int("n_group", 1) or 1,
        topk_group=f.int("topk_group", 1) or 1,
        expert_bias="select" if any(k.endswith("mlp.gate.expert_bias") for k in names) else None,
    )
    return make_config(
        path,
        **_common(path, cj, f),
        mlp_hidden=f.int("intermediate_size"),
        qkv_bias=any(k.endswith("attention.query_key_value.bias") for k in names),
        o_bias=any(k.endswith("self_attn.o_proj.bias") for k in names),
        qk_norm=bool(f.bool("use_qk_norm", False)),
        attention="block_causal",
        block_size=f.int("block_size", LLADA2_BLOCK),
        logit_shift=False,
        moe=moe,
    )


# LLaDA2.1's published decoding modes (model card; diffusers' docs for LLaDA2Pipeline; SGLang's
# JointThreshold, whose edit_threshold 0 is the speed mode's full editing)
LLADA21_MODES: dict[str, dict[str, Any]] = {
    "quality": {"threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 16},
    "speed": {"threshold": 0.5, "editing_threshold": 0.0, "max_post_steps": 16},
}
LLADA21_NAME = re.compile(r"llada-?2\.1", re.IGNORECASE)


def is_llada21(path: Path, cj: dict[str, Any]) -> bool:
    """Whether a LLaDA2.x checkpoint is LLaDA2.1, by its name (its config is 2.0's)."""
    return any(LLADA21_NAME.search(str(s)) for s in (path, cj.get("_name_or_path") or ""))


def llada2_mode(path: Path, cj: dict[str, Any]) -> str | None:
    return "quality" if is_llada21(path, cj) else None


TOKENIZER = fast_tokenizer_loader({"mask_token": MASK_TOKEN}, [EOT_TOKEN])

LLADA_MOE = register_family(
    Family(
        name="llada_moe",
        architectures=("LLaDAMoEModelLM", "LLaDAMoEModel", "LLaDAMoeModelLM"),
        load=load_llada_moe,
        tokenizer=TOKENIZER,
        defaults={"policy": "low_confidence", "block_length": 32, "temperature": 0.0},
        checkpoints=("inclusionAI/LLaDA-MoE-7B-A1B-Base", "inclusionAI/LLaDA-MoE-7B-A1B-Instruct"),
        doc="bidirectional masked diffusion, OLMoE-like MoE (softmax top-k router)",
    )
)

LLADA2 = register_family(
    Family(
        name="llada2",
        architectures=("LLaDA2MoeModelLM",),
        load=load_llada2,
        tokenizer=TOKENIZER,
        defaults={
            "policy": "threshold",
            "threshold": 0.95,
            "temperature": 0.0,
        },  # block: the model's (32)
        modes=LLADA21_MODES,
        default_mode=llada2_mode,
        checkpoints=(
            "inclusionAI/LLaDA2.0-mini",
            "inclusionAI/LLaDA2.0-flash",
            "inclusionAI/LLaDA2.1-mini",
            "inclusionAI/LLaDA2.1-flash",
        ),
        doc="block diffusion (blocks of 32), Ling-2.0 MoE (sigmoid group-limited router, shared "
        "expert); 2.1: token editing, quality or speed mode",
    )
)
