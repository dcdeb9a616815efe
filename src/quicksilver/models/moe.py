"""Mixture-of-experts feed-forward layer: a router, routed SwiGLU experts and an optional shared expert.

One module covers the router variants of the open MoE diffusion LMs through ``MoEConfig``
(models/config.py):

- LLaDA-MoE (OLMoE-like): softmax scores, top-k, no renormalisation; an optional expert bias is
  added to the scores, so it both selects and weights.
- LLaDA2.x (Ling-2.0 / DeepSeek-V3-like): sigmoid scores; an expert bias that only *selects*;
  group-limited top-k (groups ranked by the sum of their two best biased scores); the chosen
  unbiased scores renormalised to 1 and multiplied by a routed scaling factor; an always-on
  shared expert.

Weight names follow the HF layout: ``gate.weight`` (E, C), ``gate.expert_bias`` (E,),
``experts.{e}.{gate,up,down}_proj.weight``, ``shared_experts.{gate,up,down}_proj.weight``.
Routing runs in fp32. Routed tokens are sorted by expert (``sort_by_expert``): one GEMM per
expert that received tokens (``expert_loop``), or, over experts stacked in 3-D tensors
(``StackedExperts``: DiffusionGemma's layout, or ``MoE.stack_experts`` on a GPU), one
``torch._grouped_mm`` call per projection where the device and dtype have it (``grouped_ffn``: CUDA
in bf16), equal to the loop. A runtime may swap ``experts`` for modules of its own with the same
call (runtime/weight_only.py: quantized experts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import MoEConfig
from .meta import meta_build


class ExpertMLP(nn.Module):
    """A gated MLP: down(act(gate(x)) * up(x)); SwiGLU by default (``act`` = silu)."""

    def __init__(
        self,
        d_model: int,
        hidden: int,
        act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
    ) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # (..., C)


class Router(nn.Module):
    """Scores experts per token and returns the chosen experts with their weights."""

    def __init__(self, d_model: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, d_model))
        nn.init.normal_(self.weight, std=0.02)
        if cfg.expert_bias is not None:
            self.register_buffer("expert_bias", torch.zeros(cfg.n_experts, dtype=torch.float32))
        else:
            self.expert_bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, C) -> (experts (N, k) long, weights (N, k) fp32)."""
        cfg = self.cfg
        logits = F.linear(x.float(), self.weight.float())  # (N, E)
        scores = logits.softmax(-1) if cfg.score == "softmax" else logits.sigmoid()  # (N, E)
        choice = scores
        if self.expert_bias is not None:
            choice = scores + self.expert_bias.float()  # (N, E)
            if cfg.expert_bias == "weight":
                scores = choice
        if cfg.n_group > 1:
            N, E = choice.shape
            grouped = choice.view(N, cfg.n_group, E // cfg.n_group)  # (N, G, E/G)
            group_score = grouped.topk(min(2, E // cfg.n_group), dim=-1).values.sum(-1)  # (N, G)
            keep = group_score.topk(cfg.topk_group, dim=-1).indices  # (N, topk_group)
            allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
                1, keep, True
            )  # (N, G)
            allowed = allowed[:, :, None].expand_as(grouped).reshape(N, E)  # (N, E)
            choice = choice.masked_fill(~allowed, float("-inf"))
        experts = choice.topk(cfg.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(-1, experts)  # (N, k)
        if cfg.norm_topk and cfg.top_k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return experts, weights * cfg.scale


@dataclass
class ExpertSlots:
    """The N*k routed (token, expert) slots of a pass sorted by expert."""

    tokens: torch.Tensor  # (S,) long: the token of each slot, expert by expert
    weights: torch.Tensor  # (S,) fp32: its routing weight
    counts: list[int]  # (E,) slots per expert
    offsets: torch.Tensor  # (E,) int32: where each expert's slots end (grouped_mm's ``offs``)


def sort_by_expert(experts: torch.Tensor, weights: torch.Tensor, n_experts: int) -> ExpertSlots:
    """experts, weights (N, k) -> the slots grouped by expert (stable: token order within one)."""
    flat = experts.reshape(-1)  # (S,) with S = N*k
    order = flat.argsort(stable=True)  # (S,)
    per_expert = torch.bincount(flat, minlength=n_experts)  # (E,)
    return ExpertSlots(
        tokens=order // experts.shape[1],
        weights=weights.reshape(-1)[order].float(),
        counts=per_expert.tolist(),
        offsets=per_expert.cumsum(0).to(torch.int32),
    )


def expert_loop(
    x: torch.Tensor, slots: ExpertSlots, expert: Callable[[int, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """x (N, C) -> (N, C) fp32: ``expert(e, rows)`` once per expert that received tokens, its
    outputs weighted and summed into each token's row."""
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)  # (N, C)
    start = 0
    for e, n in enumerate(slots.counts):
        if n == 0:
            continue
        tok, w = slots.tokens[start : start + n], slots.weights[start : start + n]  # (n,)
        y = expert(e, x[tok])  # (n, C)
        out.index_add_(0, tok, y.float() * w[:, None])
        start += n
    return out


def grouped_available(x: torch.Tensor) -> bool:
    """Whether ``grouped_ffn`` runs one grouped GEMM here: CUDA in bf16 (torch's kernels); on the
    CPU torch has a reference implementation (what the tests compare), not a fast one."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")


def grouped_ffn(
    x: torch.Tensor,
    slots: ExpertSlots,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """x (N, C) through stacked gated experts gate_up (E, 2F, C), down (E, C, F): one
    ``torch._grouped_mm`` per projection over the slots sorted by expert -> (N, C) fp32."""
    rows = x[slots.tokens]  # (S, C)
    gu = torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=slots.offsets)  # (S, 2F)
    gate, up = gu.chunk(2, dim=-1)  # (S, F) each
    y = torch._grouped_mm(act(gate) * up, down.transpose(-2, -1), offs=slots.offsets)  # (S, C)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)  # (N, C)
    return out.index_add_(0, slots.tokens, y.float() * slots.weights[:, None])


class StackedExperts(nn.Module):
    """Routed gated experts stored as 3-D tensors: gate_up_proj (E, 2F, C), down_proj (E, C, F);
    ``forward(x (N, C), experts, weights (N, k)) -> (N, C)`` in x's dtype."""

    def __init__(
        self,
        n_experts: int,
        d_model: int,
        hidden: int,
        act: Callable[[torch.Tensor], torch.Tensor] = F.silu,
    ) -> None:
        super().__init__()
        self.n_experts, self.act = n_experts, act
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * hidden, d_model))
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)

    def forward(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, grouped: bool = False
    ) -> torch.Tensor:
        """``grouped``: one grouped GEMM wherever torch has it (the CPU's reference kernel
        included: tests); by default only where it is fast (``grouped_available``)."""
        slots = sort_by_expert(experts, weights, self.n_experts)
        if grouped or grouped_available(x):
            out = grouped_ffn(x, slots, self.gate_up_proj, self.down_proj, self.act)
        else:
            out = expert_loop(x, slots, self.expert)
        return out.to(x.dtype)

    def expert(self, e: int, h: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on its rows h (n, C) -> (n, C)."""
        gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)  # (n, F) each
        return F.linear(self.act(gate) * up, self.down_proj[e])


class MoE(nn.Module):
    """Drop-in replacement for the dense MLP of a block: (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Router(d_model, cfg)
        self.experts: nn.Module = nn.ModuleList(
            ExpertMLP(d_model, cfg.expert_hidden) for _ in range(cfg.n_experts)
        )
        self.shared_experts = ExpertMLP(d_model, cfg.shared_hidden) if cfg.shared_hidden else None

    def routed(
        self, flat: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """The routed experts' sum for flat (N, C) -> (N, C) in its dtype."""
        if not isinstance(self.experts, nn.ModuleList):  # stacked or a runtime's own
            return self.experts(flat, experts, weights)
        bank = self.experts
        slots = sort_by_expert(experts, weights, self.cfg.n_experts)
        return expert_loop(flat, slots, lambda e, h: bank[e](h)).to(flat.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        flat = x.reshape(B * T, C)  # (N, C)
        experts, weights = self.gate(flat)  # (N, k), (N, k)
        y = self.routed(flat, experts, weights)  # (N, C)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(B, T, C)

    def stack_experts(self) -> None:
        """Hold the routed experts as one ``StackedExperts`` (for the grouped GEMM), their
        per-expert linears let go (inference: names no longer match the checkpoint's)."""
        if not isinstance(self.experts, nn.ModuleList):
            return
        mods = [m for m in self.experts if isinstance(m, ExpertMLP)]
        down = mods[0].down_proj
        with meta_build():
            stacked = StackedExperts(len(mods), down.out_features, down.in_features, mods[0].act)
        with torch.no_grad():
            gate_up = [torch.cat((m.gate_proj.weight, m.up_proj.weight)) for m in mods]  # (2F, C)
            stacked.gate_up_proj = nn.Parameter(torch.stack(gate_up), requires_grad=False)
            downs = [m.down_proj.weight for m in mods]  # (C, F) each
            stacked.down_proj = nn.Parameter(torch.stack(downs), requires_grad=False)
        self.experts = stacked
