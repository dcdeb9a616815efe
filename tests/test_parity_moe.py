"""Parity of the mixture-of-experts families with the nearest ``transformers`` MoE models.

- LLaDA-MoE -> ``Qwen3MoeForCausalLM`` (softmax router, top-k, ``norm_topk_prob=False``, QK-norm
  over head_dim, dense layers via ``mlp_only_layers``), bidirectional. Shim: Qwen3-MoE has no
  shared expert, so each sparse layer's ``mlp`` is wrapped to add ``shared_expert(h)`` to its
  output — exactly where LLaDA-MoE's decoder layer adds it (after the routed experts, on the same
  normalised input). Not covered by a reference: the optional ``expert_bias`` and ``clip_qkv``
  (off in the fixture; the router is unit-tested in tests/test_families_moe.py).
- LLaDA2 -> ``Glm4MoeForCausalLM`` (sigmoid router with a selection-only score-correction bias,
  group-limited top-k by the sum of the two best scores per group, renormalised, routed scaling
  factor, shared experts, ``first_k_dense_replace``, QK-norm, partial rotary 0.5 with rotate_half
  on the leading half), block-causal mask. Names mapped: fused ``query_key_value`` split in
  q, k, v order; ``dense`` -> ``o_proj``; ``query/key_layernorm`` -> ``q/k_norm``;
  ``expert_bias`` -> ``e_score_correction_bias``. One documented difference: GLM zeroes the
  scores of excluded groups where LLaDA2 sets them to -inf; with non-negative biases (sigmoid
  scores are positive) both choose the same experts, so the fixture draws biases in [0, 0.1).
- SDAR-MoE -> ``Qwen3MoeForCausalLM`` (renormalised top-k), block-causal mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from family_fixtures import write_tiny  # noqa: E402
from quicksilver.models.checkpoint import read_safetensors  # noqa: E402
from test_parity_dense import TOL, T, additive, block_causal, check_block_causal, ids_for, ours  # noqa: E402


class SharedExpertShim(torch.nn.Module):
    """Wraps a Qwen3-MoE sparse block: routed output + shared expert on the same input."""

    def __init__(self, moe: torch.nn.Module, shared: torch.nn.Module) -> None:
        super().__init__()
        self.moe, self.shared = moe, shared

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.moe(h)  # transformers 4.x: (output, router logits); 5.x: the output alone
        routed = out[0] if isinstance(out, tuple) else out
        return routed + self.shared(h)


def fit_experts(ref: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert ``experts.{e}.{gate,up,down}_proj.weight`` packed into the 3-D ``gate_up_proj``
    (E, 2F, C) and ``down_proj`` (E, C, F) that transformers >= 5 stores, when ``ref`` has them
    (transformers 4.x keeps one linear per expert and gets ``state`` unchanged)."""
    fused = {
        k[: -len("gate_up_proj")] for k in ref.state_dict() if k.endswith("experts.gate_up_proj")
    }
    if not fused:
        return state
    out = {k: v for k, v in state.items() if not any(k.startswith(p) for p in fused)}
    for p in fused:
        n = len({k[len(p) :].split(".")[0] for k in state if k.startswith(p)})
        w = lambda e, proj, p=p: state[f"{p}{e}.{proj}.weight"]  # noqa: E731
        out[p + "gate_up_proj"] = torch.stack(
            [torch.cat((w(e, "gate_proj"), w(e, "up_proj"))) for e in range(n)]
        )  # (E, 2F, C)
        out[p + "down_proj"] = torch.stack([w(e, "down_proj") for e in range(n)])  # (E, C, F)
    return out


def qwen3_moe(cj: dict, dense_ffn: int, norm_topk: bool) -> torch.nn.Module:
    mlp_only = [i for i, v in enumerate(cj.get("moe_layer_freq", [])) if v == 0] or cj.get(
        "mlp_only_layers", []
    )
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=cj["vocab_size"],
        hidden_size=cj["hidden_size"],
        intermediate_size=dense_ffn,
        moe_intermediate_size=cj.get("expert_intermediate_size") or cj["moe_intermediate_size"],
        num_hidden_layers=cj["num_hidden_layers"],
        num_attention_heads=cj["num_attention_heads"],
        num_key_value_heads=cj["num_key_value_heads"],
        head_dim=cj["hidden_size"] // cj["num_attention_heads"],
        num_experts=cj["num_experts"],
        num_experts_per_tok=cj["num_experts_per_tok"],
        norm_topk_prob=norm_topk,
        decoder_sparse_step=1,
        mlp_only_layers=mlp_only,
        rms_norm_eps=cj["rms_norm_eps"],
        rope_theta=cj["rope_theta"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attention_bias=False,
        attn_implementation="eager",
    )
    return transformers.Qwen3MoeForCausalLM(cfg)


def test_llada_moe_matches_qwen3_moe_with_shared_expert_shim(tmp_path: Path) -> None:
    write_tiny("llada_moe", tmp_path, layers=3)
    cj = json.loads((tmp_path / "config.json").read_text())
    state = read_safetensors(tmp_path)
    ref = qwen3_moe(cj, cj["dense_intermediate_size"], norm_topk=False)
    shared = {k: v for k, v in state.items() if ".shared_expert." in k}
    ref.load_state_dict(
        fit_experts(ref, {k: v for k, v in state.items() if k not in shared}), strict=True
    )
    for i, layer in enumerate(ref.model.layers):
        if cj["moe_layer_freq"][i]:
            mlp = transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeMLP(
                ref.config, intermediate_size=cj["shared_expert_intermediate_size"]
            )
            mlp.load_state_dict(
                {n: shared[f"model.layers.{i}.shared_expert.{n}"] for n in mlp.state_dict()}
            )
            layer.mlp = SharedExpertShim(layer.mlp, mlp)
    ref.eval()
    ids = ids_for(cj["vocab_size"])
    B = ids.shape[0]
    with torch.no_grad():
        want = ref(ids, attention_mask=additive(torch.ones(B, T, T, dtype=torch.bool))).logits
        causal = ref(ids).logits
    got = ours(tmp_path, ids)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"LLaDA-MoE vs Qwen3-MoE + shared expert: max |diff| {diff:.2e}"
    assert (got - causal).abs().max().item() > 1e-2


def llada2_to_glm(state: dict[str, torch.Tensor], cj: dict) -> dict[str, torch.Tensor]:
    hd, H, KV = cj["head_dim"], cj["num_attention_heads"], cj["num_key_value_heads"]
    out = {}
    for k, v in state.items():
        if k == "model.word_embeddings.weight":
            out["model.embed_tokens.weight"] = v
        elif k.endswith("attention.query_key_value.weight"):
            p = k.replace("attention.query_key_value.weight", "self_attn.")
            q, kk, vv = v.split([H * hd, KV * hd, KV * hd], dim=0)
            out.update({p + "q_proj.weight": q, p + "k_proj.weight": kk, p + "v_proj.weight": vv})
        elif k.endswith("attention.dense.weight"):
            out[k.replace("attention.dense", "self_attn.o_proj")] = v
        elif k.endswith("attention.query_layernorm.weight"):
            out[k.replace("attention.query_layernorm", "self_attn.q_norm")] = v
        elif k.endswith("attention.key_layernorm.weight"):
            out[k.replace("attention.key_layernorm", "self_attn.k_norm")] = v
        elif k.endswith("mlp.gate.expert_bias"):
            out[k.replace("expert_bias", "e_score_correction_bias")] = v
        else:
            out[k] = v
    return out


def test_llada2_matches_glm4_moe_block_causal(tmp_path: Path) -> None:
    write_tiny("llada2", tmp_path, layers=3)
    cj = json.loads((tmp_path / "config.json").read_text())
    cfg = transformers.Glm4MoeConfig(
        vocab_size=cj["vocab_size"],
        hidden_size=cj["hidden_size"],
        intermediate_size=cj["intermediate_size"],
        num_hidden_layers=cj["num_hidden_layers"],
        num_attention_heads=cj["num_attention_heads"],
        num_key_value_heads=cj["num_key_value_heads"],
        head_dim=cj["head_dim"],
        partial_rotary_factor=cj["partial_rotary_factor"],
        moe_intermediate_size=cj["moe_intermediate_size"],
        num_experts_per_tok=cj["num_experts_per_tok"],
        n_shared_experts=cj["num_shared_experts"],
        n_routed_experts=cj["num_experts"],
        routed_scaling_factor=cj["routed_scaling_factor"],
        n_group=cj["n_group"],
        topk_group=cj["topk_group"],
        first_k_dense_replace=cj["first_k_dense_replace"],
        norm_topk_prob=cj["norm_topk_prob"],
        use_qk_norm=cj["use_qk_norm"],
        attention_bias=cj["use_qkv_bias"],
        rms_norm_eps=cj["rms_norm_eps"],
        rope_theta=cj["rope_theta"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    ref = transformers.Glm4MoeForCausalLM(cfg)
    ref.load_state_dict(
        fit_experts(ref, llada2_to_glm(read_safetensors(tmp_path), cj)), strict=True
    )
    ref.eval()
    check_block_causal(ref, tmp_path, cj, "LLaDA2 vs GLM-4-MoE")


def test_sdar_moe_matches_qwen3_moe_block_causal(tmp_path: Path) -> None:
    write_tiny("sdar_moe", tmp_path, layers=3)
    cj = json.loads((tmp_path / "config.json").read_text())
    ref = qwen3_moe(cj, cj["intermediate_size"], norm_topk=True)
    ref.load_state_dict(fit_experts(ref, read_safetensors(tmp_path)), strict=True)
    ref.eval()
    ids = ids_for(cj["vocab_size"])
    B = ids.shape[0]
    with torch.no_grad():
        want = ref(ids, attention_mask=additive(block_causal(T, cj["block_size"], B))).logits
    got = ours(tmp_path, ids)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"SDAR-MoE vs Qwen3-MoE(block-causal): max |diff| {diff:.2e}"
