"""Unit tests of the MoE layer (models/moe.py) against direct per-token formulas, for the router
variants no transformers model covers (LLaDA-MoE's expert bias that also weights, top-1), and the
model-level hooks (partial rotary, clip_qkv, dense layers chosen by config)."""

from __future__ import annotations

import torch

from quicksilver.models.config import ModelConfig, MoEConfig
from quicksilver.models.moe import MoE
from quicksilver.models.transformer import MLP, Transformer


def naive(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the definition, no batching tricks."""
    cfg, out = moe.cfg, []
    bias = moe.gate.expert_bias
    for h in x.reshape(-1, x.shape[-1]):
        logits = moe.gate.weight @ h  # (E,)
        s = logits.softmax(-1) if cfg.score == "softmax" else logits.sigmoid()
        choice = s + bias if bias is not None else s.clone()
        if bias is not None and cfg.expert_bias == "weight":
            s = choice
        if cfg.n_group > 1:
            g = choice.view(cfg.n_group, -1)
            best = g.topk(2, -1).values.sum(-1).topk(cfg.topk_group).indices
            keep = torch.zeros(cfg.n_group, dtype=torch.bool)
            keep[best] = True
            choice = torch.where(
                keep[:, None].expand_as(g).reshape(-1), choice, torch.tensor(float("-inf"))
            )
        idx = choice.topk(cfg.top_k).indices
        w = s[idx]
        if cfg.norm_topk and cfg.top_k > 1:
            w = w / w.sum()
        w = w * cfg.scale
        y = sum(wi * moe.experts[int(e)](h[None])[0] for wi, e in zip(w, idx))
        if moe.shared_experts is not None:
            y = y + moe.shared_experts(h[None])[0]
        out.append(y)
    return torch.stack(out).view_as(x)


def make(cfg: MoEConfig, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(16, cfg)
    with torch.no_grad():
        moe.gate.weight.normal_(std=0.5)
        if moe.gate.expert_bias is not None:
            moe.gate.expert_bias.uniform_(-0.2, 0.2)
    return moe.eval()


def test_router_variants_match_the_definition() -> None:
    x = torch.randn(2, 5, 16)
    variants = [
        MoEConfig(n_experts=8, top_k=2, expert_hidden=8),  # OLMoE / LLaDA-MoE
        MoEConfig(
            n_experts=8, top_k=2, expert_hidden=8, expert_bias="weight", shared_hidden=12
        ),  # + bias, shared
        MoEConfig(
            n_experts=8,
            top_k=3,
            expert_hidden=8,
            score="sigmoid",
            norm_topk=True,
            scale=2.5,
            n_group=4,
            topk_group=2,
            expert_bias="select",
            shared_hidden=8,
        ),  # LLaDA2
        MoEConfig(
            n_experts=4, top_k=1, expert_hidden=8, score="sigmoid", norm_topk=True, scale=1.5
        ),  # top-1
        MoEConfig(n_experts=8, top_k=2, expert_hidden=8, norm_topk=True),  # Qwen3-MoE / SDAR-MoE
    ]
    for i, cfg in enumerate(variants):
        moe = make(cfg, seed=i)
        with torch.no_grad():
            diff = (moe(x) - naive(moe, x)).abs().max().item()
        assert diff < 1e-5, f"variant {i}: {diff:.2e}"


def test_expert_bias_changes_choice_and_weights_as_configured() -> None:
    x = torch.randn(1, 6, 16)
    sel = make(MoEConfig(n_experts=8, top_k=2, expert_hidden=8, expert_bias="select"))
    wei = make(MoEConfig(n_experts=8, top_k=2, expert_hidden=8, expert_bias="weight"))
    wei.load_state_dict(sel.state_dict())
    with torch.no_grad():
        assert (
            sel(x) - wei(x)
        ).abs().max() > 1e-4  # "weight" adds the bias to the mixing weights too


def test_block_picks_dense_or_moe_from_config_and_hooks() -> None:
    cfg = ModelConfig(
        vocab_size=64,
        d_model=32,
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        mlp_hidden=48,
        partial_rotary_factor=0.5,
        o_bias=True,
        clip_qkv=0.5,
        qk_norm=True,
        moe=MoEConfig(n_experts=4, top_k=2, expert_hidden=16, layers=[1, 2]),
    )
    model = Transformer(cfg)
    kinds = [type(layer.mlp) for layer in model.model.layers]
    assert kinds == [MLP, MoE, MoE]
    assert model.rotary.inv_freq.numel() == cfg.rotary_dim // 2 == 2
    assert model.model.layers[0].self_attn.o_proj.bias is not None
    assert ModelConfig.from_dict(cfg.to_dict()).moe == cfg.moe  # round trip through JSON-able dicts
    with torch.no_grad():
        out = model(torch.randint(0, 64, (2, 7)))
    assert out.shape == (2, 7, 64) and torch.isfinite(out).all()


def test_partial_rotary_leaves_tail_dims_untouched() -> None:
    from quicksilver.models.transformer import Rotary, apply_rotary

    rot = Rotary(8, 10000.0)
    cos, sin = rot(torch.arange(5)[None] + 3)
    x = torch.randn(1, 2, 5, 16)
    y = apply_rotary(x, cos, sin)
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert (y[..., :8] - x[..., :8]).abs().max() > 1e-3
