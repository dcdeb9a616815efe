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

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from .config import ModelConfig
from .host import to_device
from .kvcache import KVCache, KVPool
from .moe import MoE
from .packing import LAYOUTS, Layout, PerSequence, plan_batched, token_bucket
from .pass_plan import RUNTIMES, PassPlanner
from .segment import Segment, StepBackend, build_attention_mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(
                x, self.weight.shape, self.weight, self.eps
            )  # one fused op, same numbers
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
        self.qkv_int8: nn.Module | None = None  # q, k, v as one int8 linear (models/quantize.py)
        self.clip = cfg.clip_qkv
        self.q_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.norm_eps) if cfg.qk_norm else None

    def _qkv_fused(self, x: torch.Tensor) -> torch.Tensor:
        """q, k and v of ``x`` (B, T, C) in one matmul (inference): (B, T, (H + 2Hkv) hd)."""
        if self.qkv_int8 is not None:
            return self.qkv_int8(x)
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

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, enable_gqa=self.n_kv != self.n_heads
        )
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
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        """Padded batch (B, T, C); with a cache, keys/values go after its committed part."""
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache.write(layer, k, v)  # (B, Hkv, L+T, hd)
        return self.output(self.attend(q, k, v, mask))

    def forward_packed(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: Layout, layer: int
    ) -> torch.Tensor:
        """Packed sequences (1, sum T_i, C): projections batched, attention as ``layout`` says
        (per sequence, or one call for all), each sequence with its own cache."""
        q, k, v = self.project(x, cos, sin)  # (1, H, Ttot, hd)
        return self.output(layout.attend(self.attend, q, k, v, layer))


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
        self.gate_up_int8: nn.Module | None = None  # gate and up as one int8 linear (quantize.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or torch.is_grad_enabled() or not self.fused:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (B, T, C)
        if self.gate_up_int8 is not None:
            gate_up = self.gate_up_int8(x)
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

    def forward(self, x, cos, sin, mask, cache, layer, packed=None):  # type: ignore[no-untyped-def]
        h = self.input_layernorm(x)
        if packed is None:
            a = self.self_attn(h, cos, sin, mask, cache, layer)
        else:
            a = self.self_attn.forward_packed(h, cos, sin, packed, layer)
        x = x + a  # (B, T, C)
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
        self.attention_layout = "per_sequence"  # see models.packing
        self.kv_heads = (
            cfg.n_kv_heads
        )  # key/value heads held here (per rank under tensor parallelism)
        self.quantized = "none"  # weight format of the linears (models/quantize.py)
        self.static_shapes = False  # pad packed tokens to buckets (batched layout; CUDA graphs)
        self.step_backend: StepBackend | None = None  # e.g. OpenVINO for every row's CPU passes
        self.kv_pool = (
            KVPool()
        )  # freed decode caches, reused with what a step backend bound to them
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

    def compile_blocks(self, mode: str | None = None, dynamic: bool = True) -> None:
        """torch.compile the per-token parts of every block (MLP and norms; attention stays eager
        because its shapes follow the packed batch). Measured slower on the 2-core CPU (docs/LOG.md);
        meant for GPUs."""
        for layer in self.model.layers:
            assert isinstance(layer, Block)
            for mod in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
                mod.forward = torch.compile(mod.forward, mode=mode, dynamic=dynamic)  # type: ignore[method-assign]
        self.model.norm.forward = torch.compile(self.model.norm.forward, mode=mode, dynamic=dynamic)  # type: ignore[method-assign]

    def compile_static(self) -> None:
        """CUDA graphs: bucketed static shapes (the batched attention layout, packed tokens padded
        to a power of two) and ``torch.compile(mode="reduce-overhead")`` of the per-token parts, one
        graph per bucket. On a CPU the same code compiles without graphs (for tests)."""
        self.set_attention_layout("batched")
        self.static_shapes = True
        self.compile_blocks(mode="reduce-overhead", dynamic=False)

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
        cos, sin = self.rotary(positions)
        x = self.model.embed_tokens(input_ids)  # (B, T, C)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, attn_mask, cache, i)
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
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

    def _segment_mask(self, seg: Segment) -> torch.Tensor | None:
        """The segment's attention mask, or None when every query may see every key."""
        cfg = self.config
        if cfg.attention == "bidirectional":
            return None  # a whole sequence, no padding: every key is visible
        T = seg.length
        first, last = seg.start, seg.start + T - 1
        if cfg.attention == "causal" and T == 1:
            return None
        if cfg.attention == "block_causal" and first // cfg.block_size == last // cfg.block_size:
            return None  # one block against earlier (cached) blocks: all visible
        L = seg.cache.length if seg.cache is not None else 0
        k_pos = seg.positions
        if L:
            assert seg.cache is not None
            k_pos = torch.cat((seg.cache.committed_positions()[0], seg.positions))  # (L+T,)
        draft_from = None
        if seg.draft_from is not None:
            draft_from = to_device([seg.draft_from], torch.long, seg.ids.device)  # (1,)
        return build_attention_mask(
            cfg.attention, cfg.block_size, seg.positions[None], k_pos[None], None, draft_from
        )

    def set_attention_layout(self, name: str) -> None:
        """``per_sequence`` (one attention call per sequence) or ``batched`` (one per layer)."""
        if name not in LAYOUTS:
            raise ConfigError(f"attention layout must be one of {LAYOUTS}, got {name!r}")
        if self.static_shapes and name != "batched":
            raise ConfigError("static shapes need the batched attention layout")
        self.attention_layout = name

    def _layout(
        self, segments: list[Segment], spans: list[tuple[int, int]], n_tokens: int
    ) -> Layout:
        caches = [s.cache for s in segments]
        if self.attention_layout == "per_sequence":
            return PerSequence(spans, caches, [self._segment_mask(s) for s in segments])
        key_lens = [  # cached keys, plus this pass's unless they overwrite cached ones (dual)
            (0 if s.cache is None else s.cache.length) + (0 if s.overwrite else s.length)
            for s in segments
        ]
        cfg = self.config
        device = segments[0].ids.device
        draft_from = None
        if any(s.draft for s in segments):
            none = cfg.max_seq_len + max(s.start + s.length for s in segments)  # past every query
            draft_from = to_device(
                [none if s.draft_from is None else s.draft_from for s in segments],
                torch.long,
                device,
            )  # (R,)

        def mask(q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor) -> torch.Tensor:
            return build_attention_mask(
                cfg.attention, cfg.block_size, q_pos, k_pos, k_valid, draft_from
            )

        starts = [s.start for s in segments]
        return plan_batched(
            spans, starts, caches, key_lens, mask, cfg.max_seq_len, n_tokens, device
        )

    def pass_cost(self, n: int, unread: int = 0) -> int:
        """What a one-sequence cached pass of ``n`` new tokens costs, in positions (the first
        ``unread`` appended without their logits read): the step backend's ``cost``, else ``n``
        (eager torch runs the exact shape)."""
        return n if self.step_backend is None else self.step_backend.cost(n, unread)

    @property
    def planner(self) -> PassPlanner:
        """What a verify pass feeds per row on this model's runtime (models/pass_plan.py)."""
        if self.step_backend is not None:
            return PassPlanner(self.step_backend.pass_policy, self.step_backend.cost)
        device = next(self.parameters()).device
        return PassPlanner(RUNTIMES["cpu" if device.type == "cpu" else "accelerator"])

    def forward_segments(self, segments: list[Segment]) -> list[torch.Tensor]:
        """Packed inference forward: one pass for several sequences, each with its own KV cache.

        Returns per segment the logits (hi - lo, V) of its tokens [lo, hi), aligned (shift applied).
        With a step backend attached, every segment it covers runs through it on its own, exactly
        as it would alone (so a row's logits never depend on the other rows of its pass); the
        rest are packed into one torch pass.
        """
        if self.step_backend is None:
            return self._forward_packed(segments)
        out = self.step_backend.forward_each(segments)
        rest = [i for i, o in enumerate(out) if o is None]
        if rest:
            for i, o in zip(rest, self._forward_packed([segments[i] for i in rest])):
                out[i] = o
        return [o for o in out if o is not None]

    def _forward_packed(self, segments: list[Segment]) -> list[torch.Tensor]:
        """The segments as one packed torch pass (see ``forward_segments``)."""
        cfg = self.config
        ids = (
            torch.cat([s.ids for s in segments])[None]
            if len(segments) > 1
            else segments[0].ids[None]
        )  # (1, Ttot)
        seg_pos = [s.positions for s in segments]  # (T_i,) each
        pos = torch.cat(seg_pos)[None] if len(segments) > 1 else seg_pos[0][None]  # (1, Ttot)
        spans, start = [], 0
        for s in segments:
            spans.append((start, start + s.length))
            start = spans[-1][1]
            if s.cache is not None and not s.overwrite:
                L, T = s.cache.length, s.length
                s.cache.reserve(
                    cfg.n_layers,
                    1,
                    self.kv_heads,
                    cfg.dim_head,
                    L + T,
                    self.model.embed_tokens.weight.dtype,
                    ids.device,
                )
        for s, sp in zip(segments, seg_pos):
            if s.cache is not None:
                if s.overwrite:
                    assert s.start + s.length <= s.cache.length, (
                        "overwrite inside the cached range only"
                    )
                    s.cache.cursor = s.start
                else:
                    s.cache.cursor = None
                    s.cache.write_meta(sp[None], None)
        if self.static_shapes:  # padding tokens at position 0, in no segment: never read
            pad = token_bucket(spans[-1][1]) - spans[-1][1]
            ids, pos = F.pad(ids, (0, pad)), F.pad(pos, (0, pad))  # (1, Tpad)
        layout = self._layout(segments, spans, int(ids.shape[1]))  # caches know the positions
        cos, sin = self.rotary(pos, max(s.start + s.length for s in segments) - 1)
        x = self.model.embed_tokens(ids)  # (1, Ttot, C)
        for li, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None, None, li, packed=layout)
        h = self.model.norm(x)[0]  # (Ttot, C)
        out = []
        for s, (a, _) in zip(segments, spans):
            if cfg.logit_shift:
                src_lo = a + s.lo - 1
                if (
                    src_lo < a
                ):  # the first wanted token's predictor is the last cached one (or itself)
                    first = (
                        s.cache.last_logits
                        if s.cache is not None and s.cache.last_logits is not None
                        else self.lm_head(h[a : a + 1])
                    )  # (1, V)
                    rest = self.lm_head(h[a : a + s.hi - 1])  # (hi-1, V)
                    out.append(torch.cat((first.reshape(1, -1), rest))[: s.hi - s.lo])
                else:
                    out.append(self.lm_head(h[src_lo : a + s.hi - 1]))  # (hi-lo, V)
            else:
                out.append(self.lm_head(h[a + s.lo : a + s.hi]))  # (hi-lo, V)
            if s.cache is not None:
                s.cache.cursor = None
            if s.append and s.cache is not None:
                s.cache.commit(s.append)
                kept = s.kept()
                if cfg.logit_shift and kept is not None:
                    s.cache.last_logits = self.lm_head(h[a + kept : a + kept + 1])  # (1, V) raw
        return out
