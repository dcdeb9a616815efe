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


@dataclass
class Segment:
    """One sequence's share of a packed forward pass.

    ``ids``/``positions`` (T,) are the tokens after whatever ``cache`` already holds; the first
    ``append`` of them are added to the cache; logits are returned for tokens ``[lo, hi)``.
    """

    ids: torch.Tensor  # (T,) long
    positions: torch.Tensor  # (T,) long
    lo: int
    hi: int
    cache: KVCache | None = None
    append: int = 0


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
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape  # (B, T, C)
        q = self.q_proj(x).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads)
        return y  # (B, H, Tq, hd)

    def output(self, y: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))  # (B, T, C)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded batch: (B, T, C) with an optional cached prefix shared in shape by all rows."""
        q, k, v = self.project(x, cos, sin)
        new_k, new_v = k, v
        if past is not None:
            k = torch.cat((past[0], k), dim=2)  # (B, Hkv, L+T, hd)
            v = torch.cat((past[1], v), dim=2)
        return self.output(self.attend(q, k, v, mask)), new_k, new_v

    def forward_packed(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spans: list[tuple[int, int]],
                       pasts: list[tuple[torch.Tensor, torch.Tensor] | None], masks: list[torch.Tensor | None]
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed sequences (1, sum T_i, C): projections batched, attention per sequence with its own cache.

        Each sequence's attention sees exactly the tensors it would see alone, so a row's result does
        not depend on its batch-mates (batch invariance).
        """
        q, k, v = self.project(x, cos, sin)  # (1, H, Ttot, hd)
        ys = []
        for (s, e), past, m in zip(spans, pasts, masks):
            ki, vi = k[:, :, s:e], v[:, :, s:e]
            if past is not None:
                ki = torch.cat((past[0], ki), dim=2)  # (1, Hkv, L+T_i, hd)
                vi = torch.cat((past[1], vi), dim=2)
            ys.append(self.attend(q[:, :, s:e], ki, vi, m))
        return self.output(torch.cat(ys, dim=2)), k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past, packed=None):  # type: ignore[no-untyped-def]
        h = self.input_layernorm(x)
        if packed is None:
            a, k, v = self.self_attn(h, cos, sin, mask, past)
        else:
            a, k, v = self.self_attn.forward_packed(h, cos, sin, *packed)
        x = x + a  # (B, T, C)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
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
        self.rotary = Rotary(cfg.dim_head, cfg.rope_theta)
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

    def _segment_mask(self, seg: Segment) -> torch.Tensor | None:
        cfg = self.config
        cached = seg.cache is not None and seg.cache.length > 0
        if cfg.attention == "bidirectional":
            return None  # a whole sequence, no padding: every key is visible
        k_pos = seg.positions
        if cached:
            assert seg.cache is not None and seg.cache.positions is not None
            k_pos = torch.cat((seg.cache.positions[0], seg.positions))  # (L+T,)
        return build_attention_mask(cfg.attention, cfg.block_size, seg.positions[None], k_pos[None], None)

    def forward_segments(self, segments: list[Segment]) -> list[torch.Tensor]:
        """Packed inference forward: one pass for several sequences, each with its own KV cache.

        Returns per segment the logits (hi - lo, V) of its tokens [lo, hi), aligned (shift applied).
        """
        cfg = self.config
        ids = torch.cat([s.ids for s in segments])[None]  # (1, Ttot)
        pos = torch.cat([s.positions for s in segments])[None]  # (1, Ttot)
        spans, start = [], 0
        for s in segments:
            spans.append((start, start + int(s.ids.shape[0])))
            start = spans[-1][1]
        masks = [self._segment_mask(s) for s in segments]
        cos, sin = self.rotary(pos)
        x = self.model.embed_tokens(ids)  # (1, Ttot, C)
        appended: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in segments]
        for li, layer in enumerate(self.model.layers):
            pasts = [(s.cache.k[li], s.cache.v[li]) if s.cache is not None and s.cache.length else None
                     for s in segments]
            x, k, v = layer(x, cos, sin, None, None, packed=(spans, pasts, masks))
            for j, (s, (a, _)) in enumerate(zip(segments, spans)):
                if s.append:
                    appended[j][0].append(k[:, :, a:a + s.append])  # (1, Hkv, A, hd)
                    appended[j][1].append(v[:, :, a:a + s.append])
        h = self.model.norm(x)[0]  # (Ttot, C)
        out = []
        for s, (a, _), (ks, vs) in zip(segments, spans, appended):
            if cfg.logit_shift:
                src_lo = a + s.lo - 1
                if src_lo < a:  # the first wanted token's predictor is the last cached one (or itself)
                    first = (s.cache.last_logits if s.cache is not None and s.cache.last_logits is not None
                             else self.lm_head(h[a:a + 1]))  # (1, V)
                    rest = self.lm_head(h[a:a + s.hi - 1])  # (hi-1, V)
                    out.append(torch.cat((first.reshape(1, -1), rest))[: s.hi - s.lo])
                else:
                    out.append(self.lm_head(h[src_lo:a + s.hi - 1]))  # (hi-lo, V)
            else:
                out.append(self.lm_head(h[a + s.lo:a + s.hi]))  # (hi-lo, V)
            if s.append and s.cache is not None:
                c = s.cache
                new_pos = s.positions[: s.append][None]  # (1, A)
                if c.length:
                    c.k = [torch.cat((o, n), dim=2) for o, n in zip(c.k, ks)]
                    c.v = [torch.cat((o, n), dim=2) for o, n in zip(c.v, vs)]
                    assert c.positions is not None
                    c.positions = torch.cat((c.positions, new_pos), dim=1)
                else:
                    c.k, c.v, c.positions = ks, vs, new_pos
                c.valid = None
                if cfg.logit_shift:
                    c.last_logits = self.lm_head(h[a + s.append - 1])[None]  # (1, V) raw
        return out
