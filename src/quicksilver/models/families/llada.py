"""LLaDA (GSAI-ML LLaDA-8B-Base / -Instruct, LLaDA-1.5): a bidirectional LLaMA-shaped masked-diffusion LM.

Facts (config.json, modeling_llada.py and tokenizer_config.json of huggingface.co/GSAI-ML/LLaDA-8B-Instruct): architecture ``LLaDAModelLM``; OLMo-style config keys
(``d_model``, ``n_heads``, ``n_kv_heads``, ``n_layers``, ``mlp_hidden_size``, ``embedding_size``,
``rms_norm_eps``, ``rope_theta``, ``weight_tying``, ``mask_token_id`` 126336); weights under
``model.transformer.*`` with ``attn_norm``/``attn_out``/``ff_norm``/``ff_proj`` (gate, SiLU)/
``up_proj``/``ff_out`` (down) and ``transformer.ff_out`` as the LM head. Half-split RoPE, RMSNorm,
no bias, no causal mask, no logit shift. ``<|mdm_mask|>`` is not declared as the tokenizer's mask
token and ``<|eot_id|>`` ends a turn. Decoding as published: low-confidence remasking in
semi-autoregressive blocks of 32 (ML-GSAI/LLaDA generate.py / chat.py), temperature 0.
"""

from __future__ import annotations

from pathlib import Path

from ...errors import CheckpointError
from ..checkpoint import State, read_safetensors
from ..config import ModelConfig
from .common import Fields, fast_tokenizer_loader, make_config, rename, token_id
from .registry import Family, register_family

MASK_TOKEN, MASK_ID = "<|mdm_mask|>", 126336
EOS_ID = 126081
EOT_TOKEN = "<|eot_id|>"

# The only LLaDA block the released checkpoints use; anything else is refused rather than misread.
REQUIRED = {
    "block_type": "llama",
    "layer_norm_type": "rms",
    "activation_type": "silu",
    "rope": True,
    "alibi": False,
    "attention_layer_norm": False,
    "input_emb_norm": False,
    "scale_logits": False,
    "include_bias": False,
    "bias_for_layer_norm": False,
    "block_group_size": 1,
}

RENAMES = [
    (r"model\.transformer\.wte\.weight", r"model.embed_tokens.weight"),
    (
        r"model\.transformer\.blocks\.(\d+)\.attn_norm\.weight",
        r"model.layers.\1.input_layernorm.weight",
    ),
    (
        r"model\.transformer\.blocks\.(\d+)\.([qkv])_proj\.(weight|bias)",
        r"model.layers.\1.self_attn.\2_proj.\3",
    ),
    (
        r"model\.transformer\.blocks\.(\d+)\.attn_out\.weight",
        r"model.layers.\1.self_attn.o_proj.weight",
    ),
    (
        r"model\.transformer\.blocks\.(\d+)\.ff_norm\.weight",
        r"model.layers.\1.post_attention_layernorm.weight",
    ),
    (
        r"model\.transformer\.blocks\.(\d+)\.ff_proj\.weight",
        r"model.layers.\1.mlp.gate_proj.weight",
    ),
    (r"model\.transformer\.blocks\.(\d+)\.up_proj\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"model\.transformer\.blocks\.(\d+)\.ff_out\.weight", r"model.layers.\1.mlp.down_proj.weight"),
    (r"model\.transformer\.ln_f\.weight", r"model.norm.weight"),
    (r"model\.transformer\.ff_out\.weight", r"lm_head.weight"),
]


def llada_config(path: Path, cj: dict) -> ModelConfig:
    f = Fields(path, cj, "LLaDA")
    for key, want in REQUIRED.items():
        have = cj.get(key, want)
        if have != want:
            raise CheckpointError(
                f"{path}/config.json: unsupported LLaDA variant {key}={have!r} (expected {want!r})"
            )
    d_model, n_heads = f.int("d_model"), f.int("n_heads")
    n_kv = f.int("n_kv_heads", None)
    if n_kv is None:
        n_kv = 1 if cj.get("multi_query_attention") else n_heads
    mlp = f.int("mlp_hidden_size", None) or f.int("mlp_ratio", 4) * d_model
    vocab = f.int("embedding_size", None) or f.int("vocab_size")
    eos = f.ids("eos_token_id", EOS_ID)
    return make_config(
        path,
        vocab_size=vocab,
        d_model=d_model,
        n_layers=f.int("n_layers"),
        n_heads=n_heads,
        n_kv_heads=n_kv,
        mlp_hidden=mlp,
        max_seq_len=f.int("max_sequence_length", 4096),
        rope_theta=f.float("rope_theta", 10000.0),
        norm_eps=f.float("rms_norm_eps", 1e-5),
        qkv_bias=f.bool("include_qkv_bias", False),
        tie_embeddings=f.bool("weight_tying", False),
        attention="bidirectional",
        logit_shift=False,
        mask_token_id=token_id(path, f, "mask_token_id", MASK_TOKEN, MASK_ID),
        eos_token_ids=eos,
        pad_token_id=f.int("pad_token_id", eos[0]),
        architecture=cj["architectures"][0],
    )


def load_llada(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    cfg = llada_config(path, cj)
    return cfg, rename(read_safetensors(path), RENAMES)


LLADA = register_family(
    Family(
        name="llada",
        architectures=("LLaDAModelLM",),
        load=load_llada,
        tokenizer=fast_tokenizer_loader({"mask_token": MASK_TOKEN}, [EOT_TOKEN]),
        defaults={"policy": "low_confidence", "block_length": 32, "temperature": 0.0},
        checkpoints=("GSAI-ML/LLaDA-8B-Base", "GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-1.5"),
        doc="bidirectional masked diffusion, LLaMA-shaped, no logit shift",
    )
)
