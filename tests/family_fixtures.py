"""Tiny random checkpoints in each family's exact upstream directory layout (tests, demos, benchmarks).

``write_tiny(family, out)`` writes what the published repository would hold — ``config.json``
with the real keys, weights under the upstream names (sharded with ``model.safetensors.index.json``
where the real one is sharded), tokenizer files in the family's format (``tokenizer.json``, or only
``vocab.json`` + ``merges.txt`` for Dream and Fast-dLLM v2), special tokens by their real names,
and a chat template — at a toy size with random weights. Nothing here is upstream code: names,
keys and token strings are those of the published checkpoints (each family module names its source).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from quicksilver.models.families.common import QWEN2_PATTERN

FAMILY_NAMES = ("llada", "dream", "fast_dllm_v2", "sdar", "sdar_moe", "llada_moe", "llada2")

# LLaDA's chat template as published in its tokenizer_config.json (huggingface.co/GSAI-ML/LLaDA-8B-Instruct).
LLADA_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
)
# ChatML with the Qwen2.5 default system prompt (Dream, Fast-dLLM v2, SDAR), tools left out.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# The Ling / LLaDA-MoE / LLaDA2 role format (huggingface.co/inclusionAI/LLaDA-MoE-7B-A1B-Instruct).
ROLE_TEMPLATE = (
    "{%- for m in messages -%}{{- '<role>' + {'system': 'SYSTEM', 'user': 'HUMAN', 'assistant': 'ASSISTANT'}"
    "[m['role']] + '</role>' + m['content'] + '<|role_end|>' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<role>ASSISTANT</role>' -}}{%- endif -%}"
)

# Special tokens per family, in id order after the byte-level base vocabulary.
SPECIALS: dict[str, list[str]] = {
    "llada": [
        "<|startoftext|>",
        "<|endoftext|>",
        "<|mdm_mask|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"],
    "fast_dllm_v2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "|<MASK>|"],
    "sdar": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"],
    "llada_moe": ["<|endoftext|>", "<|role_end|>", "<|mask|>", "<role>", "</role>"],
}
SPECIALS["sdar_moe"] = SPECIALS["sdar"]
SPECIALS["llada2"] = SPECIALS["llada_moe"]

TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, vocab=320)


def _byte_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return vocab, merges


def _fast(
    vocab: dict[str, int], merges: list[tuple[str, str]], specials: list[str]
) -> FastTokenizer:
    fast = FastTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    fast.normalizer = normalizers.NFC()
    fast.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    fast.decoder = decoders.ByteLevel()
    fast.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return fast


def write_tokenizer(family: str, out: Path) -> dict[str, int]:
    """Tokenizer files in the family's format; returns special token -> id."""
    vocab, merges = _byte_vocab()
    specials = SPECIALS[family]
    ids = {t: len(vocab) + i for i, t in enumerate(specials)}
    decoder = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t, i in ids.items()
    }
    cfg: dict[str, Any] = {
        "added_tokens_decoder": decoder,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }
    if family == "llada":
        cfg.update(
            tokenizer_class="PreTrainedTokenizerFast",
            bos_token="<|startoftext|>",
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            add_bos_token=False,
            add_eos_token=False,
            chat_template=LLADA_TEMPLATE,
        )
    elif family == "dream":
        cfg.update(
            tokenizer_class="DreamTokenizer",
            bos_token="<|beginoftext|>",
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            mask_token="<|mask|>",
            add_bos_token=False,
            errors="replace",
            additional_special_tokens=["<|beginoftext|>", "<|mask|>"],
            chat_template=CHATML_TEMPLATE,
            auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        )
    elif family == "fast_dllm_v2":
        cfg.update(
            tokenizer_class="Qwen2Tokenizer",
            eos_token="<|im_end|>",
            pad_token="<|im_end|>",
            bos_token=None,
        )
    elif family in ("sdar", "sdar_moe"):
        cfg.update(
            tokenizer_class="Qwen2Tokenizer",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            bos_token=None,
            chat_template=CHATML_TEMPLATE,
        )
    else:  # llada_moe, llada2
        cfg.update(
            tokenizer_class="PreTrainedTokenizerFast",
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            mask_token="<|mask|>",
            chat_template=ROLE_TEMPLATE,
        )
    if family in ("dream", "fast_dllm_v2"):  # vocab.json + merges.txt only (no tokenizer.json)
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        (out / "merges.txt").write_text(
            "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
        )
        (out / "added_tokens.json").write_text(json.dumps(ids))
        if family == "fast_dllm_v2":
            (out / "chat_template.jinja").write_text(CHATML_TEMPLATE)
    else:
        _fast(vocab, merges, specials).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {k: cfg[k] for k in ("bos_token", "eos_token", "pad_token", "mask_token") if cfg.get(k)}
        )
    )
    return ids


class _Rand:
    def __init__(self, seed: int) -> None:
        self.g = torch.Generator().manual_seed(seed)

    def w(self, *shape: int, std: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g) * std

    def norm(self, n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=self.g)

    def uniform(self, n: int, hi: float) -> torch.Tensor:
        return torch.rand(n, generator=self.g) * hi


def _mlp(r: _Rand, prefix: str, C: int, F: int) -> dict[str, torch.Tensor]:
    return {
        f"{prefix}.gate_proj.weight": r.w(F, C),
        f"{prefix}.up_proj.weight": r.w(F, C),
        f"{prefix}.down_proj.weight": r.w(C, F),
    }


def _routed(r: _Rand, i: int, C: int, E: int, FE: int) -> dict[str, torch.Tensor]:
    """Layer i's router and routed experts (Qwen-MoE names)."""
    state = {f"model.layers.{i}.mlp.gate.weight": r.w(E, C, std=0.5)}
    for e in range(E):
        state.update(_mlp(r, f"model.layers.{i}.mlp.experts.{e}", C, FE))
    return state


def _save(out: Path, state: dict[str, torch.Tensor], shards: int) -> None:
    state = {k: v.contiguous() for k, v in state.items()}
    if shards <= 1:
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(state)
    per = -(-len(names) // shards)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: state[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )


def _qwen_layers(
    r: _Rand, L: int, C: int, H: int, KV: int, hd: int, F: int, bias: bool, qk_norm: bool
) -> dict[str, torch.Tensor]:
    s: dict[str, torch.Tensor] = {}
    for i in range(L):
        p = f"model.layers.{i}"
        s[f"{p}.input_layernorm.weight"] = r.norm(C)
        s[f"{p}.post_attention_layernorm.weight"] = r.norm(C)
        s[f"{p}.self_attn.q_proj.weight"] = r.w(H * hd, C)
        s[f"{p}.self_attn.k_proj.weight"] = r.w(KV * hd, C)
        s[f"{p}.self_attn.v_proj.weight"] = r.w(KV * hd, C)
        s[f"{p}.self_attn.o_proj.weight"] = r.w(C, H * hd)
        if bias:
            for n, rows in (("q", H * hd), ("k", KV * hd), ("v", KV * hd)):
                s[f"{p}.self_attn.{n}_proj.bias"] = r.w(rows)
        if qk_norm:
            s[f"{p}.self_attn.q_norm.weight"] = r.norm(hd)
            s[f"{p}.self_attn.k_norm.weight"] = r.norm(hd)
        if F:
            s.update(_mlp(r, f"{p}.mlp", C, F))
    return s


def write_tiny(family: str, out: str | Path, seed: int = 0, **over: Any) -> Path:
    """Write a tiny random checkpoint of ``family`` (one of FAMILY_NAMES) into ``out``."""
    if family not in FAMILY_NAMES:
        raise ValueError(f"unknown family {family!r}; choose one of {FAMILY_NAMES}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d = {**TINY, **over}
    C, L, H, KV, F, V = d["hidden"], d["layers"], d["heads"], d["kv_heads"], d["ffn"], d["vocab"]
    hd = C // H
    r = _Rand(seed)
    ids = write_tokenizer(family, out)
    state: dict[str, torch.Tensor] = {}
    shards = 1
    if family == "llada":
        cj: dict[str, Any] = {
            "activation_type": "silu",
            "alibi": False,
            "alibi_bias_max": 8.0,
            "architectures": ["LLaDAModelLM"],
            "attention_dropout": 0.0,
            "attention_layer_norm": False,
            "attention_layer_norm_with_affine": True,
            "bias_for_layer_norm": False,
            "block_group_size": 1,
            "block_type": "llama",
            "d_model": C,
            "embedding_dropout": 0.0,
            "embedding_size": V,
            "eos_token_id": ids["<|endoftext|>"],
            "flash_attention": False,
            "include_bias": False,
            "include_qkv_bias": False,
            "init_device": "meta",
            "init_fn": "mitchell",
            "init_std": 0.02,
            "input_emb_norm": False,
            "layer_norm_type": "rms",
            "layer_norm_with_affine": True,
            "mask_token_id": ids["<|mdm_mask|>"],
            "max_sequence_length": 4096,
            "mlp_hidden_size": F,
            "mlp_ratio": 4,
            "model_type": "llada",
            "multi_query_attention": None,
            "n_heads": H,
            "n_kv_heads": KV,
            "n_layers": L,
            "pad_token_id": ids["<|endoftext|>"],
            "precision": "amp_bf16",
            "residual_dropout": 0.0,
            "rms_norm_eps": 1e-05,
            "rope": True,
            "rope_full_precision": True,
            "rope_theta": 500000.0,
            "scale_logits": False,
            "transformers_version": "4.46.3",
            "use_cache": False,
            "vocab_size": V,
            "weight_tying": False,
        }
        state["model.transformer.wte.weight"] = r.w(V, C, std=1.0)
        for i in range(L):
            p = f"model.transformer.blocks.{i}"
            state.update(
                {
                    f"{p}.attn_norm.weight": r.norm(C),
                    f"{p}.q_proj.weight": r.w(C, C),
                    f"{p}.k_proj.weight": r.w(KV * hd, C),
                    f"{p}.v_proj.weight": r.w(KV * hd, C),
                    f"{p}.attn_out.weight": r.w(C, C),
                    f"{p}.ff_norm.weight": r.norm(C),
                    f"{p}.ff_proj.weight": r.w(F, C),
                    f"{p}.up_proj.weight": r.w(F, C),
                    f"{p}.ff_out.weight": r.w(C, F),
                }
            )
        state["model.transformer.ln_f.weight"] = r.norm(C)
        state["model.transformer.ff_out.weight"] = r.w(V, C)
        shards = 2
        (out / "generation_config.json").write_text(
            json.dumps(
                {"bos_token_id": ids["<|startoftext|>"], "eos_token_id": ids["<|endoftext|>"]}
            )
        )
    elif family in ("dream", "fast_dllm_v2"):
        cj = {
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "hidden_size": C,
            "initializer_range": 0.02,
            "intermediate_size": F,
            "max_position_embeddings": 4096,
            "max_window_layers": L,
            "num_attention_heads": H,
            "num_hidden_layers": L,
            "num_key_value_heads": KV,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": V,
        }
        if family == "dream":
            eos = ids["<|endoftext|>"]
            cj.update(
                architectures=["DreamModel"],
                model_type="Dream",
                bos_token_id=eos,
                eos_token_id=eos,
                pad_token_id=eos,
                mask_token_id=ids["<|mask|>"],
                use_mrope=False,
                auto_map={
                    "AutoConfig": "configuration_dream.DreamConfig",
                    "AutoModel": "modeling_dream.DreamModel",
                },
            )
            shards = 2
        else:
            eos = ids["<|im_end|>"]
            cj.update(
                architectures=["Fast_dLLM_QwenForCausalLM"],
                model_type="Fast_dLLM_Qwen",
                bd_size=d.get("block", 4),
                conplemenrary_mask=True,
                bos_token_id=ids["<|endoftext|>"],
                eos_token_id=eos,
                pad_token_id=eos,
            )
        state["model.embed_tokens.weight"] = r.w(V, C, std=1.0)
        state.update(_qwen_layers(r, L, C, H, KV, hd, F, bias=True, qk_norm=False))
        state["model.norm.weight"] = r.norm(C)
        state["lm_head.weight"] = r.w(V, C)
    elif family in ("sdar", "sdar_moe"):
        eos = ids["<|im_end|>"]
        cj = {
            "architectures": ["SDARForCausalLM" if family == "sdar" else "SDARMoeForCausalLM"],
            "model_type": "sdar" if family == "sdar" else "sdar_moe",
            "attention_bias": False,
            "head_dim": hd,
            "hidden_act": "silu",
            "hidden_size": C,
            "intermediate_size": F,
            "max_position_embeddings": 4096,
            "num_attention_heads": H,
            "num_hidden_layers": L,
            "num_key_value_heads": KV,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "vocab_size": V,
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": eos,
            "pad_token_id": ids["<|endoftext|>"],
            "block_size": d.get("block", 4),
            "torch_dtype": "float32",
        }
        state["model.embed_tokens.weight"] = r.w(V, C, std=1.0)
        if family == "sdar":
            state.update(_qwen_layers(r, L, C, H, KV, hd, F, bias=False, qk_norm=True))
        else:
            E, K, FE = d.get("experts", 8), d.get("top_k", 2), d.get("expert_ffn", 32)
            cj.update(
                num_experts=E,
                num_experts_per_tok=K,
                moe_intermediate_size=FE,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[0],
                router_aux_loss_coef=0.001,
            )
            state.update(_qwen_layers(r, L, C, H, KV, hd, 0, bias=False, qk_norm=True))
            state.update(_mlp(r, "model.layers.0.mlp", C, F))
            for i in range(1, L):
                state.update(_routed(r, i, C, E, FE))
        state["model.norm.weight"] = r.norm(C)
        state["lm_head.weight"] = r.w(V, C)
    elif family == "llada_moe":
        E, K, FE, FS = (
            d.get("experts", 8),
            d.get("top_k", 2),
            d.get("expert_ffn", 32),
            d.get("shared_ffn", 48),
        )
        freq = [0] + [1] * (L - 1)
        cj = {
            "architectures": ["LLaDAMoEModelLM"],
            "model_type": "llada",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "clip_qkv": None,
            "dense_intermediate_size": F,
            "expert_intermediate_size": FE,
            "shared_expert_intermediate_size": FS,
            "hidden_act": "silu",
            "hidden_size": C,
            "max_position_embeddings": 8192,
            "moe_layer_freq": freq,
            "moe_router_enable_expert_bias": False,
            "norm_topk_prob": False,
            "num_attention_heads": H,
            "num_experts": E,
            "num_experts_per_tok": K,
            "num_hidden_layers": L,
            "num_key_value_heads": KV,
            "partial_rotary_factor": 1.0,
            "qk_layernorm": True,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 50000.0,
            "router_aux_loss_coef": 0.01,
            "tie_word_embeddings": False,
            "vocab_size": V,
            "eos_token_id": ids["<|endoftext|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "torch_dtype": "float32",
        }
        state["model.embed_tokens.weight"] = r.w(V, C, std=1.0)
        state.update(_qwen_layers(r, L, C, H, KV, hd, 0, bias=False, qk_norm=True))
        state.update(_mlp(r, "model.layers.0.mlp", C, F))
        for i in range(1, L):
            state.update(_routed(r, i, C, E, FE))
            state.update(_mlp(r, f"model.layers.{i}.shared_expert", C, FS))
        state["model.norm.weight"] = r.norm(C)
        state["lm_head.weight"] = r.w(V, C)
    else:  # llada2
        E, K, FE, G, TG = d.get("experts", 8), d.get("top_k", 2), d.get("expert_ffn", 32), 4, 2
        cj = {
            "architectures": ["LLaDA2MoeModelLM"],
            "model_type": "llada2_moe",
            "hidden_size": C,
            "num_hidden_layers": L,
            "num_attention_heads": H,
            "num_key_value_heads": KV,
            "head_dim": hd,
            "intermediate_size": F,
            "moe_intermediate_size": FE,
            "num_experts": E,
            "num_experts_per_tok": K,
            "num_shared_experts": 1,
            "n_group": G,
            "topk_group": TG,
            "first_k_dense_replace": 1,
            "routed_scaling_factor": 2.5,
            "score_function": "sigmoid",
            "norm_topk_prob": True,
            "moe_router_enable_expert_bias": True,
            "use_qk_norm": True,
            "use_qkv_bias": False,
            "use_bias": False,
            "partial_rotary_factor": 0.5,
            "rope_theta": 600000.0,
            "rms_norm_eps": 1e-06,
            "max_position_embeddings": 4096,
            "vocab_size": V,
            "pad_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "block_size": d.get("block", 4),
            "torch_dtype": "float32",
        }
        state["model.word_embeddings.weight"] = r.w(V, C, std=1.0)
        for i in range(L):
            p = f"model.layers.{i}"
            state.update(
                {
                    f"{p}.input_layernorm.weight": r.norm(C),
                    f"{p}.post_attention_layernorm.weight": r.norm(C),
                    f"{p}.attention.query_key_value.weight": r.w((H + 2 * KV) * hd, C),
                    f"{p}.attention.dense.weight": r.w(C, H * hd),
                    f"{p}.attention.query_layernorm.weight": r.norm(hd),
                    f"{p}.attention.key_layernorm.weight": r.norm(hd),
                }
            )
            if i == 0:
                state.update(_mlp(r, f"{p}.mlp", C, F))
                continue
            state[f"{p}.mlp.gate.weight"] = r.w(E, C, std=0.5)
            state[f"{p}.mlp.gate.expert_bias"] = r.uniform(
                E, 0.1
            )  # >= 0: see tests/test_parity_moe.py
            for e in range(E):
                state.update(_mlp(r, f"{p}.mlp.experts.{e}", C, FE))
            state.update(_mlp(r, f"{p}.mlp.shared_experts", C, FE))
        state["model.norm.weight"] = r.norm(C)
        state["lm_head.weight"] = r.w(V, C)
    (out / "config.json").write_text(json.dumps(cj, indent=2))
    _save(out, state, shards)
    return out


# ---- I-DLM (a Qwen3ForCausalLM directory with a mask token; see families/idlm.py) ---------------
IDLM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|MASK|>"]
# ChatML without a default system prompt (the shape of Qwen3's template, tools and thinking left out).
QWEN3_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)


def write_tiny_idlm(
    out: str | Path, seed: int = 0, tie: bool = False, mask: bool = True, **over: Any
) -> Path:
    """A tiny random I-DLM-style checkpoint in Qwen3's on-disk format: Qwen3-8B's config.json keys
    (``architectures ["Qwen3ForCausalLM"]``), Qwen3 weight names (QK-norm, ``head_dim`` != hidden /
    heads, no biases) in two shards with an index, ``tokenizer.json`` whose added tokens end in
    ``<|MASK|>`` (declared as ``mask_token``, as in I-DLM's tokenizer_config.json). ``tie``: tied
    embeddings, no ``lm_head.weight`` (the small Qwen3s); ``mask=False``: a plain Qwen3 (no mask
    token); ``block_size=k`` in ``over`` writes I-DLM's masks-per-block key."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    d = {**TINY, **over}
    C, L, H, KV, F, V = d["hidden"], d["layers"], d["heads"], d["kv_heads"], d["ffn"], d["vocab"]
    hd = d.get("head_dim", 2 * C // H)
    r = _Rand(seed)
    vocab, merges = _byte_vocab()
    specials = IDLM_SPECIALS if mask else IDLM_SPECIALS[:-1]
    ids = {t: len(vocab) + i for i, t in enumerate(specials)}
    _fast(vocab, merges, specials).save(str(out / "tokenizer.json"))
    entry = dict(lstrip=False, normalized=False, rstrip=False, single_word=False, special=True)
    tcfg: dict[str, Any] = {
        "add_bos_token": False,
        "added_tokens_decoder": {str(i): {"content": t, **entry} for t, i in ids.items()},
        "bos_token": None,
        "chat_template": QWEN3_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if mask:
        tcfg["mask_token"] = "<|MASK|>"
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    cj: dict[str, Any] = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        "head_dim": hd,
        "hidden_act": "silu",
        "hidden_size": C,
        "initializer_range": 0.02,
        "intermediate_size": F,
        "max_position_embeddings": 4096,
        "max_window_layers": L,
        "model_type": "qwen3",
        "num_attention_heads": H,
        "num_hidden_layers": L,
        "num_key_value_heads": KV,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": tie,
        "torch_dtype": "float32",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": V,
    }
    if "block_size" in d:
        cj["block_size"] = d["block_size"]
    state = {"model.embed_tokens.weight": r.w(V, C, std=1.0)}
    state.update(_qwen_layers(r, L, C, H, KV, hd, F, bias=False, qk_norm=True))
    state["model.norm.weight"] = r.norm(C)
    if not tie:
        state["lm_head.weight"] = r.w(V, C)
    (out / "config.json").write_text(json.dumps(cj, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": cj["bos_token_id"], "eos_token_id": cj["eos_token_id"]})
    )
    _save(out, state, shards=2)
    return out
