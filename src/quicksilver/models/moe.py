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
Routing runs in fp32; the expert loop visits only experts that received tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import MoEConfig


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


class MoE(nn.Module):
    """Drop-in replacement for the dense MLP of a block: (B, T, C) -> (B, T, C)."""

    def __init__(self, d_model: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Router(d_model, cfg)
        self.experts = nn.ModuleList(
            ExpertMLP(d_model, cfg.expert_hidden) for _ in range(cfg.n_experts)
        )
        self.shared_experts = ExpertMLP(d_model, cfg.shared_hidden) if cfg.shared_hidden else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape  # (B, T, C)
        flat = x.reshape(B * T, C)  # (N, C)
        experts, weights = self.gate(flat)  # (N, k), (N, k)
        out = torch.zeros(B * T, C, dtype=torch.float32, device=x.device)  # (N, C) fp32 accumulator
        flat_e = experts.reshape(-1)  # (N*k,)
        order = flat_e.argsort(stable=True)  # slots grouped by expert
        counts = torch.bincount(flat_e, minlength=self.cfg.n_experts).tolist()
        tokens = order // self.cfg.top_k  # (N*k,) token of each sorted slot
        w_sorted = weights.reshape(-1)[order]  # (N*k,)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            tok, w = tokens[start : start + n], w_sorted[start : start + n]
            y = self.experts[e](flat[tok])  # (n, C)
            out.index_add_(0, tok, y.float() * w[:, None])
            start += n
        y = out.to(x.dtype)
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(B, T, C)
