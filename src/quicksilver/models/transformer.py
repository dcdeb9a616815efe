"""The generic transformer: one network for our own models and the LLaMA/Qwen-shaped diffusion LMs.

Token embedding -> n_layers x [RMSNorm -> GQA attention with RoPE -> RMSNorm -> SwiGLU MLP] ->
RMSNorm -> LM head. The attention pattern (bidirectional, block_causal, causal), q/k/v bias, QK-norm,
tied embeddings and the Dream one-position logit shift are config fields, so the same module runs
a masked-diffusion model, a block-diffusion model and the equal-size autoregressive baseline.

``model(input_ids) -> logits (B, T, V)``, aligned so that ``logits[:, j]`` predicts token ``j``
(the shift, when configured, is applied inside). An optional ``KVCache`` holds keys and values of
earlier positions (exact for block_causal/causal models, an approximation for bidirectional ones).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)  # HF-Llama order: normalise in fp32, cast, then scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Half-split (NeoX / HF-Llama) rotary embedding, cos/sin computed in fp32 from positions."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    rd = cos.shape[-1]
    if rd < x.shape[-1]:  # partial rotary: rotate the leading rd dims, pass the rest through
        xr, xp = x[..., :rd], x[..., rd:]  # (B, H, T, rd), (B, H, T, hd - rd)
        return torch.cat((xr * cos + rotate_half(xr) * sin, xp), dim=-1).to(dtype)
    return (x * cos + rotate_half(x) * sin).to(dtype)  # (B, H, T, hd)


@dataclass
class KVCache:
    """Keys/values of positions already run through the network, per layer.

    ``positions`` and ``valid`` (B, L) describe the cached keys for mask building; ``last_logits``
    (B, V) is the raw output at the last cached position (needed by logit-shifted models).
    """

    k: list[torch.Tensor] = field(default_factory=list)  # per layer (B, Hkv, L, hd)
    v: list[torch.Tensor] = field(default_factory=list)
    positions: torch.Tensor | None = None  # (B, L)
    valid: torch.Tensor | None = None  # (B, L) bool
    last_logits: torch.Tensor | None = None  # (B, V) raw (unshifted)

    @property
    def length(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[1])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def select_rows(self, rows: torch.Tensor) -> "KVCache":
        """The cache of a subset of batch rows (requests leaving a batch)."""
        return KVCache(
            [t[rows] for t in self.k], [t[rows] for t in self.v],
            None if self.positions is None else self.positions[rows],
            None if self.valid is None else self.valid[rows],
            None if self.last_logits is None else self.last_logits[rows],
        )

    def truncate(self, length: int) -> None:
        """Drop cached positions from ``length`` on."""
        self.k = [t[:, :, :length] for t in self.k]
        self.v = [t[:, :, :length] for t in self.v]
        if self.positions is not None:
            self.positions = self.positions[:, :length]
            self.valid = self.valid[:, :length] if self.valid is not None else None


def build_attention_mask(
    pattern: str, block_size: int, q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor | None
) -> torch.Tensor:
    """Boolean mask (B, 1, Tq, Tk), True = may attend, from positions (not tensor indices).

    bidirectional: every valid key; causal: keys at positions <= the query's; block_causal: keys in
    the query's own block or an earlier one (block = position // block_size). Rows with no key at
    all (padding queries) are opened fully so attention never produces NaN; their outputs are unused.
    """
    qp = q_pos[:, :, None]  # (B, Tq, 1)
    kp = k_pos[:, None, :]  # (B, 1, Tk)
    if pattern == "bidirectional":
        m = torch.ones(qp.shape[0], qp.shape[1], kp.shape[2], dtype=torch.bool, device=q_pos.device)
    elif pattern == "causal":
        m = kp <= qp
    else:  # block_causal
        m = torch.div(kp, block_size, rounding_mode="floor") <= torch.div(qp, block_size, rounding_mode="floor")
    if k_valid is not None:
        m = m & k_valid[:, None, :]
    m = m | ~m.any(-1, keepdim=True)
    return m[:, None]  # (B, 1, Tq, Tk)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.dim_head
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, hd
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=cfg.o_bias)
        self.clip = cfg.clip_qkv
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape  # (B, T, C)
        q = self.q_proj(x).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        new_k, new_v = k, v
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, L+T, hd)
            v = torch.cat((past[1], v), dim=2)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads
        )  # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd)  # (B, T, H*hd)
        return self.o_proj(y), new_k, new_v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.moe is not None and cfg.moe.is_moe_layer(layer_idx):
            from .moe import MoE

            self.mlp: nn.Module = MoE(cfg.d_model, cfg.moe)
        else:
            self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past):  # type: ignore[no-untyped-def]
        a, k, v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past)
        x = x + a  # (B, T, C)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class DiffusionLM(nn.Module):
    """The network. Weight names follow the HF Llama/Qwen layout (``model.layers.{i}.self_attn...``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta)
        self.apply(self._init)
        for name, p in self.named_parameters():  # scaled init of residual outputs (GPT-2)
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        cache: KVCache | None = None,
        append: bool = False,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V) for ``input_ids`` (B, T).

        positions: (B, T) absolute positions (default: continue after the cache, or 0..T-1).
        valid: (B, T) bool, False for padding / dropped positions: nobody attends to them.
        cache: keys/values of earlier positions; with ``append`` the new ones are added to it.
        attn_mask: an explicit (B, 1, T, L+T) bool mask overriding the configured pattern.
        """
        cfg = self.config
        B, T = input_ids.shape
        start = cache.length if cache is not None else 0
        if positions is None:
            base = cache.positions[:, -1:] + 1 if cache is not None and cache.length else start
            positions = torch.arange(T, device=input_ids.device)[None, :] + base  # (B, T)
            positions = positions.expand(B, T)
        if attn_mask is None:
            k_pos, k_valid = positions, valid
            if cache is not None and cache.length:
                assert cache.positions is not None
                k_pos = torch.cat((cache.positions, positions), dim=1)  # (B, L+T)
                cv = cache.valid if cache.valid is not None else torch.ones_like(cache.positions, dtype=torch.bool)
                nv = valid if valid is not None else torch.ones_like(positions, dtype=torch.bool)
                k_valid = torch.cat((cv, nv), dim=1)
            trivial = cfg.attention == "bidirectional" and (k_valid is None or bool(k_valid.all()))
            attn_mask = None if trivial else build_attention_mask(
                cfg.attention, cfg.block_size, positions, k_pos, k_valid)
        cos, sin = self.rotary(positions)
        x = self.model.embed_tokens(input_ids)  # (B, T, C)
        new_k: list[torch.Tensor] = []
        new_v: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            past = (cache.k[i], cache.v[i]) if cache is not None and cache.length else None
            x, k, v = layer(x, cos, sin, attn_mask, past)
            new_k.append(k)
            new_v.append(v)
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        raw_last = logits[:, -1]
        if cfg.logit_shift:
            first = cache.last_logits[:, None] if cache is not None and cache.last_logits is not None else logits[:, :1]
            logits = torch.cat((first, logits[:, :-1]), dim=1)  # (B, T, V): j predicted from j-1
        if cache is not None and append:
            if cache.length:
                cache.k = [torch.cat((a, b), dim=2) for a, b in zip(cache.k, new_k)]
                cache.v = [torch.cat((a, b), dim=2) for a, b in zip(cache.v, new_v)]
                assert cache.positions is not None
                cache.positions = torch.cat((cache.positions, positions), dim=1)
                vv = valid if valid is not None else torch.ones_like(positions, dtype=torch.bool)
                cv = cache.valid if cache.valid is not None else torch.ones_like(cache.positions[:, :start], dtype=torch.bool)
                cache.valid = torch.cat((cv, vv), dim=1)
            else:
                cache.k, cache.v = new_k, new_v
                cache.positions = positions
                cache.valid = valid if valid is not None else torch.ones_like(positions, dtype=torch.bool)
            cache.last_logits = raw_last
        return logits
