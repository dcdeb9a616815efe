"""Token sampling: greedy at temperature 0, otherwise top-k, top-p, then Gumbel-max in float64 from a
seeded generator."""

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


def filter_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` most likely tokens of each row (0: all); ties at the k-th value stay."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (n, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def filtered(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Logits (n, V) in float64 at ``temperature``, top-k then top-p applied."""
    return filter_top_p(filter_top_k(logits.double() / temperature, top_k), top_p)


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
    top_k: int = 0,
) -> torch.Tensor:
    """x0 (n,) from logits (n, V): argmax(logits / T + Gumbel) in float64, i.e. a categorical draw."""
    if temperature <= 0.0:
        return logits.argmax(-1)
    return gumbel_max(filtered(logits, temperature, top_p, top_k), generator)


def gumbel_max(scaled: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """x0 (n,): a categorical draw from each row of filtered, scaled logits (n, V) float64."""
    return (scaled + gumbel(tuple(scaled.shape), generator, scaled.device)).argmax(-1)


def sample_with_distribution(
    logits: torch.Tensor,
    temperature: float,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_tokens`` at a temperature > 0 and the distribution (n, V) float64 it drew from,
    filtered once for both."""
    scaled = filtered(logits, temperature, top_p, top_k)  # (n, V) float64
    return gumbel_max(scaled, generator), scaled.softmax(-1)
