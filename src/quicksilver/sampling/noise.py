"""Token sampling: greedy at temperature 0, otherwise top-p + Gumbel-max in float64 from a seeded generator."""

from __future__ import annotations

import torch


def filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches ``top_p`` (at least one)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, idx = logits.sort(dim=-1, descending=True)  # (n, V)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    drop = cum - sorted_logits.softmax(-1) >= top_p  # mass before this token already reaches top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def request_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """One request's generator: seeded by ``seed``, or by a fresh random seed when it has none."""
    g = torch.Generator(device=device)
    g.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, ()).item()))
    return g


def gumbel(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=torch.float64, device=device)
    return -torch.log(-torch.log(u.clamp(1e-300, 1.0 - 1e-16)))


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """x0 (n,) from logits (n, V): argmax(logits / T + Gumbel) in float64, i.e. a categorical draw."""
    if temperature <= 0.0:
        return logits.argmax(-1)
    scaled = filter_top_p(logits.double() / temperature, top_p)  # (n, V) float64
    return (scaled + gumbel(tuple(scaled.shape), generator, scaled.device)).argmax(-1)
