"""Unmasking policies, chosen by name from a registry.

A policy scores the masked positions of the current block (higher = commit sooner) and names its
count rule: ``schedule`` commits a fixed number per step from a linear schedule (LLaDA's
low-confidence remasking), ``threshold`` commits every position whose score reaches the bound, at
least one per step (Fast-dLLM's parallel decoding). ``verify`` is not an unmasking policy: causal
models draft and verify (sampling/decoders/verify.py), so the output is the model's own AR output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# score(probs (n, V), x0 (n,), noise (n,) uniform in [0, 1)) -> (n,)
ScoreFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class Policy:
    name: str
    score: ScoreFn
    rule: str  # "schedule" | "threshold" | "verify"
    needs_noise: bool = False
    doc: str = ""


def _confidence(probs: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    return probs.gather(-1, x0[..., None]).squeeze(-1)  # (n,) p(x0)


def _margin(probs: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    top2 = probs.topk(2, dim=-1).values  # (n, 2)
    return top2[..., 0] - top2[..., 1]


def _neg_entropy(probs: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    return (probs * torch.log(probs.clamp_min(1e-30))).sum(-1)  # (n,) -H, higher = surer


def _random(probs: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    assert noise is not None
    return noise


POLICIES: dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    POLICIES[policy.name] = policy
    return policy


register(
    Policy(
        "low_confidence",
        _confidence,
        "schedule",
        doc="LLaDA: commit the k most confident positions per step, k from a linear schedule",
    )
)
register(
    Policy(
        "threshold",
        _confidence,
        "threshold",
        doc="Fast-dLLM: commit every position with p(x0) >= threshold, at least one per step",
    )
)
register(
    Policy(
        "margin",
        _margin,
        "schedule",
        doc="commit the k positions with the largest top1-top2 margin",
    )
)
register(
    Policy(
        "entropy", _neg_entropy, "schedule", doc="commit the k positions with the lowest entropy"
    )
)
register(
    Policy(
        "random", _random, "schedule", needs_noise=True, doc="commit k uniformly random positions"
    )
)
register(
    Policy(
        "verify",
        _confidence,
        "verify",
        doc="causal models: draft k tokens by diffusion, keep those the causal logits reproduce",
    )
)
