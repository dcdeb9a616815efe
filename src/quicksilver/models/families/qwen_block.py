"""Block-diffusion models on Qwen bodies: Fast-dLLM v2 (Qwen2.5) and SDAR (Qwen3, dense and MoE).

Both attend block-causally (a token sees its own block and every earlier one; blocks are aligned
at position 0), so a finished block's keys/values never change and the KV cache is exact.

- Fast-dLLM v2 (huggingface.co/Efficient-Large-Model/Fast_dLLM_v2_7B; arXiv 2509.26328): ``Fast_dLLM_QwenForCausalLM``; Qwen2 keys
  and names with q/k/v biases; block size ``bd_size`` (32); logits shifted by one like Dream; mask
  ``|<MASK>|`` 151665 (an added token, not in config.json); eos = pad ``<|im_end|>`` 151645.
  Decoding as published: 32-token blocks decoded in sub-blocks of 8, commit every token whose
  probability passes the threshold (0.9 in the paper's evaluation) and at least the best one.
- SDAR (§4.2): ``SDARForCausalLM`` / ``SDARMoeForCausalLM``; Qwen3 keys and names (QK-norm,
  ``head_dim``, no bias); block size 4 unless the config says otherwise; mask 151669 (``<|MASK|>``);
  no logit shift (trained BD3-LM style on the same positions). Decoding as published
  (``block_diffusion_generate``): ``low_confidence_dynamic`` with confidence threshold 0.85.
"""

from __future__ import annotations

from pathlib import Path

from ..checkpoint import State, read_safetensors
from ..config import ModelConfig, MoEConfig
from .common import Fields, fast_tokenizer_loader, qwen_config, token_id
from .registry import Family, register_family

FASTDLLM_MASK_TOKEN, FASTDLLM_MASK_ID = "|<MASK>|", 151665
SDAR_MASK_TOKEN, SDAR_MASK_ID = "<|MASK|>", 151669
EOT_TOKEN = "<|im_end|>"


def load_fast_dllm_v2(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    f = Fields(path, cj, "Fast-dLLM v2")
    cfg = qwen_config(
        path,
        cj,
        "Fast-dLLM v2",
        qkv_bias=True,
        attention="block_causal",
        block_size=f.int("bd_size", 32),
        logit_shift=True,
        mask_token_id=token_id(path, f, "mask_token_id", FASTDLLM_MASK_TOKEN, FASTDLLM_MASK_ID),
    )
    return cfg, read_safetensors(path)


def sdar_moe(f: Fields, n_layers: int) -> MoEConfig | None:
    """Qwen3-MoE routing (softmax, top-k, optional renormalisation, no shared expert)."""
    n_experts = f.int("num_experts", 0)
    if not n_experts:
        return None
    step = f.int("decoder_sparse_step", 1)
    dense = set(f.list("mlp_only_layers", []) or [])
    layers = [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]
    return MoEConfig(
        n_experts=n_experts,
        top_k=f.int("num_experts_per_tok"),
        expert_hidden=f.int("moe_intermediate_size"),
        layers=layers,
        score="softmax",
        norm_topk=f.bool("norm_topk_prob", False),
    )


def load_sdar(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    f = Fields(path, cj, "SDAR")
    n_layers = f.int("num_hidden_layers")
    cfg = qwen_config(
        path,
        cj,
        "SDAR",
        qkv_bias=f.bool("attention_bias", False),
        qk_norm=True,
        attention="block_causal",
        block_size=f.int("block_size", 4),
        logit_shift=False,
        mask_token_id=token_id(path, f, "mask_token_id", SDAR_MASK_TOKEN, SDAR_MASK_ID),
        moe=sdar_moe(f, n_layers),
    )
    return cfg, read_safetensors(path)  # Qwen3 / Qwen3-MoE names are our names


FAST_DLLM_V2 = register_family(
    Family(
        name="fast_dllm_v2",
        architectures=("Fast_dLLM_QwenForCausalLM",),
        load=load_fast_dllm_v2,
        tokenizer=fast_tokenizer_loader({"mask_token": FASTDLLM_MASK_TOKEN}, [EOT_TOKEN]),
        defaults={"policy": "threshold", "threshold": 0.9, "block_length": 8, "temperature": 0.0},
        checkpoints=(
            "Efficient-Large-Model/Fast_dLLM_v2_1.5B",
            "Efficient-Large-Model/Fast_dLLM_v2_7B",
        ),
        doc="block diffusion (blocks of bd_size), Qwen2.5-shaped, logits shifted by one, exact KV cache",
    )
)

SDAR = register_family(
    Family(
        name="sdar",
        architectures=("SDARForCausalLM", "SDARMoeForCausalLM"),
        load=load_sdar,
        tokenizer=fast_tokenizer_loader({"mask_token": SDAR_MASK_TOKEN}, [EOT_TOKEN]),
        defaults={
            "policy": "threshold",
            "threshold": 0.85,
            "temperature": 0.0,
        },  # block: the model's
        checkpoints=(
            "JetLM/SDAR-1.7B-Chat",
            "JetLM/SDAR-4B-Chat",
            "JetLM/SDAR-8B-Chat",
            "JetLM/SDAR-30B-A3B-Chat",
        ),
        doc="block diffusion (block 4 by default), Qwen3-shaped (QK-norm), no shift, exact KV cache",
    )
)
