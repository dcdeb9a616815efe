"""The generic transformer: one network for our own models and the LLaMA/Qwen-shaped diffusion LMs.

Token embedding -> n_layers x [RMSNorm -> GQA attention with RoPE -> RMSNorm -> SwiGLU MLP] ->
RMSNorm -> LM head. The attention pattern (bidirectional, block_causal, causal), q/k/v bias, QK-norm,
tied embeddings and the Dream one-position logit shift are config fields, so the same module runs
a masked-diffusion model, a block-diffusion model and the equal-size autoregressive baseline.

The network is weights plus one forward, ``hidden(ids, positions, attend)``, whose attention is
whatever its caller passes: ``model(input_ids) -> logits (B, T, V)`` drives it over a padded batch
with a mask (training, parity, tests; an optional ``KVCache`` holds keys and values of earlier
positions), and a runtime (runtime/runtime.py) drives it over packed segments with its own caches
and layouts. ``logits[:, j]`` predicts token ``j`` (the shift, when configured, is applied inside).
Nothing here knows how it is run fast: caches pools, step backends, quantized formats and the pass
planner belong to the runtime.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig
from .kvcache import KVCache
from .masks import build_attention_mask
from .moe import MoE

# attend(q (B, H, T, hd), k, v (B, Hkv, T, hd), layer) -> (B, H, T, hd): how a forward's attention
# runs, given by its caller (a mask and a cache for the padded path, a runtime's packed layout)
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # one fused op, same numbers
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)  # HF-Llama order: normalise in fp32, cast, then scale


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """Half-split (NeoX / HF-Llama) rotary embedding; cos/sin tables in fp32, looked up by position."""

    inv_freq: torch.Tensor  # buffers: (hd/2,) and (n, hd)
    cos_table: torch.Tensor
    sin_table: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_len: int = 4096,
        inv_freq: torch.Tensor | None = None,
    ) -> None:
        """``inv_freq`` (head_dim / 2,): explicit inverse frequencies (e.g. Gemma-4's proportional
        RoPE, whose tail frequencies are zero) instead of ``theta ** (-2i / head_dim)``."""
        super().__init__()
        inv = (
            1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            if inv_freq is None
            else inv_freq.to(torch.float32)
        )  # (hd/2,)
        self.register_buffer("inv_freq", inv, persistent=False)
        self.max_len = max_len
        self._build(min(max_len, 4096))  # grows on demand

    def _build(self, n: int) -> None:
        freqs = (
            torch.arange(n, dtype=torch.float32, device=self.inv_freq.device)[:, None]
            * self.inv_freq
        )
        emb = torch.cat((freqs, freqs), dim=-1)  # (n, hd)
        self.register_buffer("cos_table", emb.cos(), persistent=False)
        self.register_buffer("sin_table", emb.sin(), persistent=False)

    def forward(
        self, positions: torch.Tensor, max_pos: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables for ``positions``; ``max_pos`` (their maximum, when the caller knows it) saves a
        device-to-host read."""
        top = int(positions.max()) if max_pos is None else max_pos
        if top >= self.cos_table.shape[0]:
            self._build(top + 1)
        return self.cos_table[positions][:, None], self.sin_table[positions][
            :, None
        ]  # (B, 1, T, hd)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rd = cos.shape[-1]
    if rd < x.shape[-1]:  # partial rotary: rotate the leading rd dims, pass the rest through
        xr, xp = x[..., :rd], x[..., rd:]  # (B, H, T, rd), (B, H, T, hd - rd)
        return torch.cat((apply_rotary(xr, cos, sin), xp), dim=-1)
    if x.dtype == torch.float32:
        return x * cos + rotate_half(x) * sin  # (B, H, T, hd)
    dtype = x.dtype
    x = x.float()
    return (x * cos + rotate_half(x) * sin).to(dtype)


class Attention(nn.Module):
    fused = True  # one q/k/v matmul at inference (off when tensor_parallel.py shards the linears)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hd = cfg.dim_head
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, hd
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.d_model, bias=cfg.o_bias)
        self.qkv_quant: nn.Module | None = None  # q, k, v as one quantized linear (runtime)
        self.clip = cfg.clip_qkv
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def _qkv_fused(self, x: torch.Tensor) -> torch.Tensor:
        """q, k and v of ``x`` (B, T, C) in one matmul (inference): (B, T, (H + 2Hkv) hd)."""
        if self.qkv_quant is not None:
            return self.qkv_quant(x)
        w, b = _fused(self, (self.q_proj, self.k_proj, self.v_proj))
        return F.linear(x, w, b)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.training or torch.is_grad_enabled() or not self.fused:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        qkv = self._qkv_fused(x)
        nq, nk = self.n_heads * self.hd, self.n_kv * self.hd
        return qkv[..., :nq], qkv[..., nq : nq + nk], qkv[..., nq + nk :]

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape  # (B, T, C)
        if (
            not (self.training or torch.is_grad_enabled())
            and self.fused
            and self.q_norm is None
            and self.clip is None
        ):
            # inference: one matmul for q, k and v, and one rotation for q and k together
            H, Hkv = self.n_heads, self.n_kv
            qkv = self._qkv_fused(x).view(B, T, H + 2 * Hkv, self.hd)  # (B, T, H+2Hkv, hd)
            qk = apply_rotary(qkv[:, :, : H + Hkv].transpose(1, 2), cos, sin)  # (B, H+Hkv, T, hd)
            return qk[:, :H], qk[:, H:], qkv[:, :, H + Hkv :].transpose(1, 2)
        q_, k_, v_ = self._qkv(x)
        q = q_.reshape(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = k_.reshape(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = v_.reshape(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, Hkv, T, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.clip is not None:
            q, k, v = (t.clamp(-self.clip, self.clip) for t in (q, k, v))
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def output(self, y: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = y.shape
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))  # (B, T, C)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        """x (B, T, C); ``attend`` runs the attention of this layer's q, k and v."""
        q, k, v = self.project(x, cos, sin)
        return self.output(attend(q, k, v, layer))


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Attention of q (B, H, Tq, hd) over k, v (B, Hkv, Tk, hd), grouped when Hkv < H."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1]
    )  # (B, H, Tq, hd)


def _fused(
    owner: nn.Module, linears: tuple[nn.Linear, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated weights of several linears, rebuilt whenever one of them changes (inference only)."""
    key = tuple((lin.weight._version, lin.weight.data_ptr()) for lin in linears)
    cached = owner.__dict__.get("_fused_cache")
    if cached is None or cached[0] != key:
        w = torch.cat([lin.weight for lin in linears])
        bias = None
        if any(lin.bias is not None for lin in linears):
            bias = torch.cat(
                [
                    lin.bias
                    if lin.bias is not None
                    else torch.zeros(lin.out_features, dtype=w.dtype, device=w.device)
                    for lin in linears
                ]
            )
        cached = (key, w, bias)
        owner.__dict__["_fused_cache"] = cached
    return cached[1], cached[2]


class MLP(nn.Module):
    fused = True  # one gate/up matmul at inference (off when tensor_parallel.py shards the linears)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)
        self.gate_up_quant: nn.Module | None = None  # gate and up as one quantized linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or torch.is_grad_enabled() or not self.fused:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)
        if self.gate_up_quant is not None:
            gate_up = self.gate_up_quant(x)
        else:
            w, _ = _fused(self, (self.gate_proj, self.up_proj))
            gate_up = F.linear(x, w)
        gate, up = gate_up.chunk(2, dim=-1)  # (B, T, F) each
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        if cfg.moe is not None and cfg.moe.is_moe_layer(layer_idx):
            self.mlp: nn.Module = MoE(cfg.d_model, cfg.moe)
        else:
            self.mlp = MLP(cfg)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, layer: int
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend, layer)  # (B, T, C)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)


class Transformer(nn.Module):
    """The network of every family: one decoder-only transformer whose attention pattern
    (``config.attention``: bidirectional, block-causal or causal) makes it a diffusion LM, a
    block-diffusion LM or a causal LM that drafts by diffusion. Weight names follow the HF
    Llama/Qwen layout (``model.layers.{i}.self_attn...``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta, cfg.max_seq_len)
        # key/value heads held here (per rank under tensor parallelism)
        self.kv_heads = cfg.n_kv_heads
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
        raw: bool = False,
    ) -> torch.Tensor:
        """Logits (B, T, V) for ``input_ids`` (B, T): the padded-batch path (training, parity, tests).

        raw: skip the one-position logit shift (training layouts that place predictors themselves).

        positions: (B, T) absolute positions (default: continue after the cache, or 0..T-1).
        valid: (B, T) bool, False for padding / dropped positions: nobody attends to them.
        cache: keys/values of earlier positions; with ``append`` the new ones are kept in it.
        attn_mask: an explicit (B, 1, T, L+T) bool mask overriding the configured pattern.
        """
        cfg = self.config
        B, T = input_ids.shape
        L = cache.length if cache is not None else 0
        if positions is None:
            last = cache.positions if cache is not None and L else None  # (B, capacity)
            base = int(last[0, L - 1]) + 1 if last is not None else 0
            positions = (torch.arange(T, device=input_ids.device) + base)[None, :].expand(
                B, T
            )  # (B, T)
        if cache is not None:
            hd = cfg.dim_head
            cache.reserve(
                cfg.n_layers,
                B,
                self.kv_heads,
                hd,
                L + T,
                self.model.embed_tokens.weight.dtype,
                input_ids.device,
            )
            cache.write_meta(positions, valid)
        if attn_mask is None:
            k_pos, k_valid = positions, valid
            if cache is not None and L:
                assert cache.positions is not None and cache.valid is not None
                k_pos, k_valid = cache.positions[:, : L + T], cache.valid[:, : L + T]  # (B, L+T)
            trivial = cfg.attention == "bidirectional" and (k_valid is None or bool(k_valid.all()))
            attn_mask = (
                None
                if trivial
                else build_attention_mask(cfg.attention, cfg.block_size, positions, k_pos, k_valid)
            )
        mask = attn_mask

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int) -> torch.Tensor:
            if cache is not None:
                k, v = cache.write(i, k, v)  # (B, Hkv, L+T, hd)
            return sdpa(q, k, v, mask)

        logits = self.lm_head(self.hidden(input_ids, positions, attend))  # (B, T, V)
        raw_last = logits[:, -1]
        if cfg.logit_shift and not raw:
            first = (
                cache.last_logits[:, None]
                if cache is not None and cache.last_logits is not None
                else logits[:, :1]
            )
            logits = torch.cat((first, logits[:, :-1]), dim=1)  # (B, T, V): j predicted from j-1
        if cache is not None and append:
            cache.commit(T)
            cache.last_logits = raw_last
        return logits

    def hidden(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        attend: Attend,
        max_pos: int | None = None,
    ) -> torch.Tensor:
        """The one forward: ids and positions (B, T) -> final hidden states (B, T, C), normed, before
        the head; ``attend`` runs each layer's attention (``max_pos``: the positions' maximum, when
        the caller knows it, saves a device read)."""
        cos, sin = self.rotary(positions, max_pos)
        x = self.model.embed_tokens(ids)  # (B, T, C)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attend, i)
        return self.model.norm(x)  # (B, T, C)
