"""DiffusionGemma's text network: Gemma-4 layers used two ways, by a causal encoder pass and a
bidirectional decoder pass, over one set of weights and one KV cache.

Contract (numbers match ``transformers``' ``DiffusionGemmaForBlockDiffusion``, tests/test_parity_diffusion_gemma.py):

- ``DiffusionGemmaLM(cfg)`` holds the text weights (encoder and decoder share them all: embeddings,
  layers, final norm, the LM head tied to the embeddings), the decoder-only ``self_conditioning``
  block, and per layer the encoder's own ``layer_scalar`` buffer beside the decoder's.
- ``encode(ids (B, T), cache) -> logits (B, T, V)``: the causal encoder pass at positions
  ``L .. L+T-1`` after the cache's ``L``; sliding layers see the last ``sliding_window`` positions
  (their own included). Appends the keys/values of ``ids`` to ``cache``. The logits are
  ``encoder_last_hidden_state`` through the LM head (generation ignores them; the prompt's
  only effect on the canvas is the cache).
- ``decode(canvas (B, C), cache, self_conditioning_logits (B, C, V) | None, mask (B,) | None) ->
  logits (B, C, V)``: the bidirectional decoder pass over a canvas placed right after the cache.
  Every canvas position sees the whole canvas and the cache (sliding layers only its last
  ``sliding_window - 1`` positions, what transformers' dynamic cache keeps for them); the cache is
  read, never written. Self-conditioning: the previous step's logits as soft embeddings
  (softmax @ embeddings * sqrt(C)) through a gated MLP, added to the canvas embeddings, then an
  unscaled RMSNorm (applied even on the first step, when the signal is zero).
- Logits are float32 and soft-capped: ``cap * tanh(logits / cap)`` (``final_logit_softcapping``).
- Rows of a batch share one length (no padding yet).

A Gemma-4 layer: pre-norm attention (q/k RMSNorm per head before RoPE, v RMSNorm without scale,
attention scale 1.0; full-attention layers have their own head dim and KV heads and no v_proj:
v is k's projection) with a post-norm, then a dense GELU-tanh MLP and a mixture of experts side by
side on the same residual, each with its own pre/post norms, summed, post-normed, added, and the
layer output multiplied by ``layer_scalar``. The router: unscaled RMSNorm, times ``scale`` and
``d_model ** -0.5``, a linear map, softmax in fp32, top-k renormalised to 1, times
``per_expert_scale``. RoPE per layer type: sliding layers the plain half-split rotation, full layers
"proportional" (the first ``partial_rotary_factor * head_dim / 2`` frequencies of the full head
dimension, the rest zero). Embeddings are scaled by ``sqrt(d_model)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import ConfigError
from ..meta import meta_build
from ..moe import ExpertMLP, StackedExperts
from ..transformer import RMSNorm, Rotary, apply_rotary

SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_TYPES = ("default", "proportional")


@dataclass
class AttentionShape:
    """Head shape and RoPE of one layer type (sliding or full attention)."""

    head_dim: int
    n_kv_heads: int
    rope_theta: float
    rope_type: str = "default"  # default | proportional
    partial_rotary_factor: float = 1.0  # proportional: share of the frequencies that rotate
    rope_factor: float = 1.0  # proportional: frequencies divided by this

    def inv_freq(self) -> torch.Tensor:
        """Inverse frequencies (head_dim / 2,) of the half-split rotation."""
        hd = self.head_dim
        if self.rope_type == "default":
            return 1.0 / (self.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        n_rot = int(self.partial_rotary_factor * hd // 2)  # rotated angles; the rest stay still
        rot = 1.0 / (self.rope_theta ** (torch.arange(0, 2 * n_rot, 2, dtype=torch.float32) / hd))
        inv = torch.cat((rot, torch.zeros(hd // 2 - n_rot, dtype=torch.float32)))  # (hd/2,)
        return inv / self.rope_factor


@dataclass
class GemmaTextConfig:
    """The text network of a DiffusionGemma checkpoint (families/diffusion_gemma.py maps config.json)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden: int  # dense GELU-tanh MLP (and self-conditioning) width
    n_experts: int
    top_k: int
    expert_hidden: int
    layer_types: list[str]
    sliding: AttentionShape
    full: AttentionShape
    sliding_window: int
    norm_eps: float = 1e-6
    final_logit_softcapping: float | None = 30.0
    max_seq_len: int = 131072
    canvas_length: int = 256
    pad_token_id: int | None = 0
    eos_token_ids: list[int] = field(default_factory=lambda: [1])
    architecture: str = "DiffusionGemmaForBlockDiffusion"

    def __post_init__(self) -> None:
        self.validate()

    @property
    def block_size(self) -> int:
        """The block of block diffusion: one canvas (what the engine reads of any model)."""
        return self.canvas_length

    def shape(self, layer: int) -> AttentionShape:
        return self.sliding if self.layer_types[layer] == SLIDING else self.full

    def validate(self) -> None:
        if len(self.layer_types) != self.n_layers or any(
            t not in (SLIDING, FULL) for t in self.layer_types
        ):
            raise ConfigError(
                f"layer_types must name {SLIDING} or {FULL} for each of {self.n_layers} layers"
            )
        for s in (self.sliding, self.full):
            if s.rope_type not in ROPE_TYPES:
                raise ConfigError(
                    f"rope_type {s.rope_type!r} is not supported (known: {ROPE_TYPES})"
                )
            if (
                s.head_dim % 2
                or s.head_dim <= 0
                or s.n_kv_heads <= 0
                or self.n_heads % s.n_kv_heads
            ):
                raise ConfigError(
                    f"head_dim {s.head_dim} must be even and positive, and n_kv_heads {s.n_kv_heads} "
                    f"must divide n_heads {self.n_heads}"
                )
        if not 0 < self.top_k <= self.n_experts:
            raise ConfigError(f"need 0 < top_k ({self.top_k}) <= n_experts ({self.n_experts})")
        if self.sliding_window < 2:
            raise ConfigError(f"sliding_window must be at least 2, got {self.sliding_window}")


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a scale, computed in fp32 and cast back."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class GemmaAttention(nn.Module):
    def __init__(self, cfg: GemmaTextConfig, layer: int) -> None:
        super().__init__()
        s = cfg.shape(layer)
        self.n_heads, self.n_kv, self.hd, self.eps = (
            cfg.n_heads,
            s.n_kv_heads,
            s.head_dim,
            cfg.norm_eps,
        )
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, s.n_kv_heads * s.head_dim, bias=False)
        # full-attention layers have no v_proj: the values are the keys' projection
        self.v_proj = (
            nn.Linear(cfg.d_model, s.n_kv_heads * s.head_dim, bias=False)
            if cfg.layer_types[layer] == SLIDING
            else None
        )
        self.o_proj = nn.Linear(cfg.n_heads * s.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(s.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(s.head_dim, cfg.norm_eps)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, hd), k and v (B, Hkv, T, hd) of ``x`` (B, T, C), q and k rotated."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.hd)  # (B, T, H, hd)
        k_raw = self.k_proj(x).view(B, T, self.n_kv, self.hd)  # (B, T, Hkv, hd)
        v_raw = k_raw if self.v_proj is None else self.v_proj(x).view(B, T, self.n_kv, self.hd)
        q = apply_rotary(self.q_norm(q).transpose(1, 2), cos, sin)  # (B, H, T, hd)
        k = apply_rotary(self.k_norm(k_raw).transpose(1, 2), cos, sin)  # (B, Hkv, T, hd)
        v = rms(v_raw, self.eps).transpose(1, 2)  # (B, Hkv, T, hd)
        return q, k, v

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Attention of q (B, H, T, hd) over k, v (B, Hkv, S, hd) (scale 1: q and k are normed)."""
        B, _, T, _ = q.shape
        # (B, H, T, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=1.0, enable_gqa=self.n_kv != self.n_heads
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.hd))  # (B, T, C)


class GemmaRouter(nn.Module):
    def __init__(self, cfg: GemmaTextConfig) -> None:
        super().__init__()
        self.eps, self.top_k, self.root = cfg.norm_eps, cfg.top_k, cfg.d_model**-0.5
        self.proj = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.d_model))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.n_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, C) -> experts (N, k) long, weights (N, k) fp32."""
        h = rms(x, self.eps) * self.scale * self.root  # (N, C)
        probs = self.proj(h).softmax(-1, dtype=torch.float32)  # (N, E)
        w, idx = probs.topk(self.top_k, dim=-1)  # (N, k) each
        w = w / w.sum(-1, keepdim=True)
        return idx, w * self.per_expert_scale[idx].float()


class GemmaExperts(StackedExperts):
    """Routed GELU-tanh experts stored as 3-D tensors: gate_up_proj (E, 2F, C), down_proj (E, C, F)."""

    def __init__(self, cfg: GemmaTextConfig) -> None:
        super().__init__(cfg.n_experts, cfg.d_model, cfg.expert_hidden, gelu_tanh)


class GemmaLayer(nn.Module):
    layer_scalar: torch.Tensor  # (1,) buffers: the decoder pass's and the encoder pass's
    encoder_layer_scalar: torch.Tensor

    def __init__(self, cfg: GemmaTextConfig, layer: int) -> None:
        super().__init__()
        C, eps = cfg.d_model, cfg.norm_eps
        self.sliding = cfg.layer_types[layer] == SLIDING
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = ExpertMLP(C, cfg.mlp_hidden, gelu_tanh)
        self.router = GemmaRouter(cfg)
        self.experts = GemmaExperts(cfg)
        self.input_layernorm = RMSNorm(C, eps)
        self.post_attention_layernorm = RMSNorm(C, eps)
        self.pre_feedforward_layernorm = RMSNorm(C, eps)  # dense MLP in ...
        self.post_feedforward_layernorm_1 = RMSNorm(C, eps)  # ... and out
        self.pre_feedforward_layernorm_2 = RMSNorm(C, eps)  # experts in ...
        self.post_feedforward_layernorm_2 = RMSNorm(C, eps)  # ... and out
        self.post_feedforward_layernorm = RMSNorm(C, eps)  # their sum
        self.register_buffer("layer_scalar", torch.ones(1))
        self.register_buffer("encoder_layer_scalar", torch.ones(1))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The dense MLP and the experts side by side on the residual x (B, T, C)."""
        B, T, C = x.shape
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        flat = x.reshape(B * T, C)  # (N, C): the router reads the un-normed residual
        experts, weights = self.router(flat)
        routed = self.experts(self.pre_feedforward_layernorm_2(flat), experts, weights)
        routed = self.post_feedforward_layernorm_2(routed.view(B, T, C))  # (B, T, C)
        return self.post_feedforward_layernorm(dense + routed)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None,
        encoder: bool,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) attending over ``past`` keys/values then its own; returns the new x and
        x's own keys/values (B, Hkv, T, hd) for the caller to cache (or not)."""
        q, k, v = self.self_attn.project(self.input_layernorm(x), cos, sin)
        ks, vs = (
            (k, v) if past is None else (torch.cat((past[0], k), 2), torch.cat((past[1], v), 2))
        )
        a = self.self_attn.attend(q, ks, vs, mask)  # (B, T, C)
        x = x + self.post_attention_layernorm(a)
        x = x + self.feed_forward(x)
        scalar = self.encoder_layer_scalar if encoder else self.layer_scalar
        return x * scalar, k, v


class GemmaKVCache:
    """The prompt's (and finished canvases') keys and values, per layer (B, Hkv_l, L, hd_l): the
    layer types differ in head dim and KV heads. Written by ``encode``, read by ``decode``."""

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.length = 0

    def layer(self, i: int, keep: int | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer i's cached keys/values, only the last ``keep`` positions if given."""
        if not self.length:
            return None
        k, v = self.k[i], self.v[i]
        if keep is not None and keep < self.length:
            k, v = k[:, :, self.length - keep :], v[:, :, self.length - keep :]
        return k, v


class SelfConditioning(nn.Module):
    """pre-norm -> gated GELU-tanh MLP -> added to the canvas embeddings -> unscaled RMSNorm."""

    def __init__(self, cfg: GemmaTextConfig) -> None:
        super().__init__()
        self.eps = cfg.norm_eps
        self.pre_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.gate_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.mlp_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, soft: torch.Tensor | None) -> torch.Tensor:
        """x (B, Cl, C) canvas embeddings; soft the same shape, or None on the first step (a zero
        signal, whose MLP output is exactly zero)."""
        if soft is not None:
            h = self.pre_norm(soft)  # (B, Cl, C)
            x = x + self.down_proj(gelu_tanh(self.gate_proj(h)) * self.up_proj(h))
        return rms(x, self.eps)


class DiffusionGemmaLM(nn.Module):
    """The text network of ``DiffusionGemmaForBlockDiffusion`` (see the module docstring)."""

    def __init__(self, cfg: GemmaTextConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(GemmaLayer(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_conditioning = SelfConditioning(cfg)
        self.rope = nn.ModuleDict()
        self.reset_rope()

    def reset_rope(self, device: torch.device | str | None = None) -> None:
        """(Re)build the per-layer-type RoPE tables (non-persistent buffers: after a meta-device build)."""
        cfg = self.config
        for name, s in ((SLIDING, cfg.sliding), (FULL, cfg.full)):
            inv = s.inv_freq() if device is None else s.inv_freq().to(device)  # (hd/2,)
            self.rope[name] = Rotary(s.head_dim, s.rope_theta, cfg.max_seq_len, inv_freq=inv)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        w = self.embed_tokens.weight
        return self.embed_tokens(ids) * torch.tensor(self.config.d_model**0.5, dtype=w.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm, the tied LM head and the soft cap: (B, T, C) -> (B, T, V) float32."""
        out = F.linear(self.norm(x), self.embed_tokens.weight).float()  # (B, T, V)
        cap = self.config.final_logit_softcapping
        return out if cap is None else out.div_(cap).tanh_().mul_(cap)  # in place: one (B, T, V)

    def _tables(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {name: rope(positions) for name, rope in self.rope.items()}  # (B, 1, T, hd_type)

    def encode(self, ids: torch.Tensor, cache: GemmaKVCache) -> torch.Tensor:
        """The causal encoder pass over ids (B, T) after the cache; appends their keys/values."""
        cfg = self.config
        B, T = ids.shape
        L = cache.length
        pos = torch.arange(L, L + T, device=ids.device)  # (T,)
        k_pos = torch.arange(L + T, device=ids.device)  # (L+T,)
        causal = k_pos[None, :] <= pos[:, None]  # (T, L+T)
        masks = {
            FULL: causal,
            SLIDING: causal & (pos[:, None] - k_pos[None, :] < cfg.sliding_window),
        }
        tables = self._tables(pos[None].expand(B, T))
        x = self.embed(ids)  # (B, T, C)
        for i, layer in enumerate(self.layers):
            kind = cfg.layer_types[i]
            cos, sin = tables[kind]
            x, k, v = layer(x, cos, sin, cache.layer(i), masks[kind], encoder=True)
            if L:
                cache.k[i], cache.v[i] = (
                    torch.cat((cache.k[i], k), 2),
                    torch.cat((cache.v[i], v), 2),
                )
            else:
                cache.k.append(k)
                cache.v.append(v)
        cache.length = L + T
        return self.logits(x)

    def decode(
        self,
        canvas: torch.Tensor,
        cache: GemmaKVCache,
        self_conditioning_logits: torch.Tensor | None = None,
        self_conditioning_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The bidirectional decoder pass over canvas (B, Cl) right after the cache (read only)."""
        cfg = self.config
        B, Cl = canvas.shape
        L = cache.length
        x = self.embed(canvas)  # (B, Cl, C)
        soft = None
        if self_conditioning_logits is not None:
            w = self.embed_tokens.weight
            # (B, Cl, V)
            probs = self_conditioning_logits.softmax(-1, dtype=torch.float32).to(w.dtype)
            soft = (probs @ w) * torch.tensor(cfg.d_model**0.5, dtype=w.dtype)  # (B, Cl, C)
            if self_conditioning_mask is not None:
                soft = soft * self_conditioning_mask.to(soft.dtype)[:, None, None]
        x = self.self_conditioning(x, soft)
        pos = torch.arange(L, L + Cl, device=canvas.device)[None].expand(B, Cl)  # (B, Cl)
        tables = self._tables(pos)
        keep_sliding = cfg.sliding_window - 1  # what a sliding layer's cache keeps of the past
        for i, layer in enumerate(self.layers):
            kind = cfg.layer_types[i]
            cos, sin = tables[kind]
            past = cache.layer(i, keep_sliding if kind == SLIDING else None)
            x, _, _ = layer(x, cos, sin, past, None, encoder=False)
        return self.logits(x)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def expected_names(cfg: GemmaTextConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the network by name with its shape (what a loaded state must provide)."""
    with meta_build():
        net = DiffusionGemmaLM(cfg)
    return {k: tuple(t.shape) for k, t in net.state_dict().items()}
