"""Parity of the dense families with an independent implementation: Hugging Face ``transformers``.

Each test writes a tiny random checkpoint in the family's upstream layout and names
(tests/family_fixtures.py), loads it with ``quicksilver.load`` and compares the logits
with the transformers model of the same body, given the same weights under transformers' names
and the family's attention pattern as an explicit 4-D additive mask (transformers returns a 4-D
mask as it is, so causality is off):

- LLaDA -> ``LlamaForCausalLM``, bidirectional (all-zero mask), no shift; plus key padding.
- Dream -> ``Qwen2ForCausalLM``, bidirectional, our logits == the reference shifted by one.
- Fast-dLLM v2 -> ``Qwen2ForCausalLM``, block-causal mask, shifted by one.
- SDAR -> ``Qwen3ForCausalLM``, block-causal mask, no shift.

fp32 on CPU; the bound is max |diff| <= 1e-4. Each test also checks that a wrong convention (no
shift, wrong mask) is far off, so the comparison is able to fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import quicksilver  # noqa: E402
from family_fixtures import write_tiny  # noqa: E402
from quicksilver.models.checkpoint import read_safetensors  # noqa: E402

TOL = 1e-4
T = 12  # three blocks of 4 for the block-causal families


def additive(allowed: torch.Tensor) -> torch.Tensor:
    """(B, T, T) bool -> (B, 1, T, T) float additive mask (0 where allowed, -inf elsewhere)."""
    return torch.zeros(allowed.shape, dtype=torch.float32).masked_fill(~allowed, float("-inf"))[
        :, None
    ]


def block_causal(T: int, bs: int, B: int = 1) -> torch.Tensor:
    blk = torch.arange(T) // bs
    return (blk[None, :] <= blk[:, None]).expand(B, T, T)  # query row may see key column


def reference(kind: str, cj: dict, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    common = dict(
        vocab_size=cj["vocab_size"],
        hidden_size=cj["hidden_size"],
        intermediate_size=cj["intermediate_size"],
        num_hidden_layers=cj["num_hidden_layers"],
        num_attention_heads=cj["num_attention_heads"],
        num_key_value_heads=cj["num_key_value_heads"],
        rms_norm_eps=cj["rms_norm_eps"],
        rope_theta=cj["rope_theta"],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(**common, attention_bias=False, mlp_bias=False)
        )
    elif kind == "qwen2":
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    else:
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(**common, head_dim=cj["head_dim"], attention_bias=False)
        )
    model.load_state_dict(state, strict=True)
    return model.eval()


def llada_to_llama(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """LLaDA names (model_formats.md §1.4 table) -> transformers Llama names."""
    table = {
        "attn_norm": "input_layernorm",
        "q_proj": "self_attn.q_proj",
        "k_proj": "self_attn.k_proj",
        "v_proj": "self_attn.v_proj",
        "attn_out": "self_attn.o_proj",
        "ff_norm": "post_attention_layernorm",
        "ff_proj": "mlp.gate_proj",
        "up_proj": "mlp.up_proj",
        "ff_out": "mlp.down_proj",
    }
    out = {}
    for k, v in state.items():
        if k == "model.transformer.wte.weight":
            out["model.embed_tokens.weight"] = v
        elif k == "model.transformer.ln_f.weight":
            out["model.norm.weight"] = v
        elif k == "model.transformer.ff_out.weight":
            out["lm_head.weight"] = v
        else:
            _, _, _, i, part, kind = k.split(".")  # model.transformer.blocks.{i}.{part}.weight
            out[f"model.layers.{i}.{table[part]}.{kind}"] = v
    return out, {}


def ids_for(V: int, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))  # (B, T)


def ours(path: Path, ids: torch.Tensor, **kw) -> torch.Tensor:
    pipe = quicksilver.load(path, device="cpu")
    with torch.no_grad():
        return pipe.model(ids, **kw)  # (B, T, V)


def test_llada_matches_llama_bidirectional(tmp_path: Path) -> None:
    write_tiny("llada", tmp_path)
    assert (
        tmp_path / "model.safetensors.index.json"
    ).is_file()  # sharded, like the real checkpoint
    cj = json.loads((tmp_path / "config.json").read_text())
    state, _ = llada_to_llama(read_safetensors(tmp_path))
    hf_cfg = dict(
        vocab_size=cj["embedding_size"],
        hidden_size=cj["d_model"],
        intermediate_size=cj["mlp_hidden_size"],
        num_hidden_layers=cj["n_layers"],
        num_attention_heads=cj["n_heads"],
        num_key_value_heads=cj["n_kv_heads"],
        rms_norm_eps=cj["rms_norm_eps"],
        rope_theta=cj["rope_theta"],
    )
    ref = reference("llama", hf_cfg, state)
    ids = ids_for(cj["embedding_size"])
    B = ids.shape[0]
    with torch.no_grad():
        want = ref(ids, attention_mask=additive(torch.ones(B, T, T, dtype=torch.bool))).logits
        causal = ref(ids).logits  # transformers' own default: causal
    got = ours(tmp_path, ids)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"LLaDA vs Llama(bidirectional): max |diff| {diff:.2e}"
    assert (got - causal).abs().max().item() > 1e-2  # the comparison can fail

    # key padding: row 1's last 3 positions are padding nobody attends to
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[1, -3:] = False
    keys = valid[:, None, :].expand(B, T, T)
    with torch.no_grad():
        want_p = ref(ids, attention_mask=additive(keys)).logits
    got_p = ours(tmp_path, ids, valid=valid)
    diff_p = (got_p - want_p)[valid].abs().max().item()
    assert diff_p <= TOL, f"LLaDA with padding: max |diff| {diff_p:.2e}"


@pytest.mark.parametrize("family", ["dream", "fast_dllm_v2"])
def test_qwen2_families_match_qwen2_shifted(family: str, tmp_path: Path) -> None:
    write_tiny(family, tmp_path)
    cj = json.loads((tmp_path / "config.json").read_text())
    ref = reference("qwen2", cj, read_safetensors(tmp_path))  # Qwen2 names are the upstream names
    ids = ids_for(cj["vocab_size"])
    B = ids.shape[0]
    allowed = (
        torch.ones(B, T, T, dtype=torch.bool)
        if family == "dream"
        else block_causal(T, cj["bd_size"], B)
    )
    wrong = block_causal(T, 4, B) if family == "dream" else torch.ones(B, T, T, dtype=torch.bool)
    with torch.no_grad():
        raw = ref(
            ids, attention_mask=additive(allowed)
        ).logits  # (B, T, V): position i predicts i+1
        raw_wrong = ref(ids, attention_mask=additive(wrong)).logits
    want = torch.cat((raw[:, :1], raw[:, :-1]), dim=1)  # the published re-alignment
    got = ours(tmp_path, ids)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"{family} vs Qwen2 (shifted): max |diff| {diff:.2e}"
    assert (got - raw).abs().max().item() > 1e-2  # unshifted logits differ: the shift is tested
    assert (
        got - torch.cat((raw_wrong[:, :1], raw_wrong[:, :-1]), 1)
    ).abs().max().item() > 1e-2  # and the mask


def test_sdar_matches_qwen3_block_causal(tmp_path: Path) -> None:
    write_tiny("sdar", tmp_path)
    cj = json.loads((tmp_path / "config.json").read_text())
    ref = reference("qwen3", cj, read_safetensors(tmp_path))
    check_block_causal(ref, tmp_path, cj, "SDAR vs Qwen3")


def check_block_causal(ref: torch.nn.Module, path: Path, cj: dict, label: str) -> None:
    """Our logits equal the reference's under a block-causal mask, and differ from full attention
    (so the mask is really in effect)."""
    ids = ids_for(cj["vocab_size"])
    B = ids.shape[0]
    with torch.no_grad():
        want = ref(ids, attention_mask=additive(block_causal(T, cj["block_size"], B))).logits
        full = ref(ids, attention_mask=additive(torch.ones(B, T, T, dtype=torch.bool))).logits
    got = ours(path, ids)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"{label} (block-causal): max |diff| {diff:.2e}"
    assert (got - full).abs().max().item() > 1e-2
