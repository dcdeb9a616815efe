"""Pure batched selection: what every row of a step commits, decided at once on the device.

The rows' windows are padded to the widest, ``W``: logits (R, W, V), masked (R, W). Tokens are
drawn per position (greedy, or from each row's own seeded generator over its own window, so a
row's draws do not depend on its batch-mates), each row's policy scores its positions, and a row
commits its ``k`` best masked positions plus, under the ``threshold`` rule, every masked position
whose score reaches its ``tau``. Nothing here reads the device from the host.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import torch

from ...models.host import to_device
from .noise import sample_tokens
from .policies import POLICIES


def pad_windows(logits: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-row window logits (n_i, V) -> (R, W, V) float32, zero past each row's width."""
    if len(logits) == 1:
        return logits[0].float()[None]  # (1, n, V)
    return torch.nn.utils.rnn.pad_sequence(list(logits), batch_first=True).float()  # (R, W, V)


@functools.lru_cache(maxsize=16)
def _banned(mask_id: int, vocab_limit: int | None, V: int, device: torch.device) -> torch.Tensor:
    """The ids ``forbid`` bans (n,), built once: one index_fill_ per step instead of two setitems."""
    ids = [mask_id] + list(range(vocab_limit, V)) if vocab_limit is not None else [mask_id]
    return torch.tensor(ids, dtype=torch.long, device=device)


def forbid(logits: torch.Tensor, mask_id: int, vocab_limit: int | None) -> torch.Tensor:
    """The mask is never a prediction, nor an id past the tokenizer's vocabulary (in place)."""
    banned = _banned(mask_id, vocab_limit, logits.shape[-1], logits.device)  # (n,)
    return logits.index_fill_(-1, banned, float("-inf"))


def forbid_host(logits: torch.Tensor, mask_id: int, vocab_limit: int | None) -> torch.Tensor:
    """``forbid`` for logits the host reads next (the verify and AR loops' picks). On the CPU
    through numpy slices: between two passes torch's ``index_fill_`` and the first read after it
    take ~35 us on one thread of the 2-vCPU EPYC, these ~25 (docs/LOG.md, 2026-12-04)."""
    if logits.device.type != "cpu":
        return forbid(logits, mask_id, vocab_limit)
    x = logits.numpy()  # (..., V), the same memory
    x[..., mask_id] = -np.inf
    if vocab_limit is not None:
        x[..., vocab_limit:] = -np.inf
    return logits


def greedy_ids(rows: Sequence[torch.Tensor]) -> list[list[int]]:
    """The argmax of each row's logits (w_i, V), as lists, in one transfer. On the CPU through
    numpy: torch's argmax over a (17, 1024) step takes ~20 us on one thread of the 2-vCPU EPYC,
    numpy's ~2, and every torch op between passes also slows the next pass (docs/LOG.md,
    2026-12-02)."""
    if rows[0].device.type == "cpu":
        return [r.numpy().argmax(-1).tolist() for r in rows]
    best = pad_windows(rows).argmax(-1).tolist()  # (R, W)
    return [b[: len(r)] for b, r in zip(best, rows)]


def top_probabilities(
    rows: Sequence[torch.Tensor], spans: Sequence[tuple[int, int]]
) -> list[list[float]]:
    """Per row's logits (w_i, V), the probability of the argmax at its positions [a_i, b_i) of
    ``spans``: only the positions asked for are exponentiated (numpy on the CPU, as ``greedy_ids``)."""
    if rows[0].device.type != "cpu":
        p = pad_windows(rows).softmax(-1).amax(-1).tolist()  # (R, W), one transfer
        return [p[i][a:b] for i, (a, b) in enumerate(spans)]
    out: list[list[float]] = []
    for r, (a, b) in zip(rows, spans):
        if a == b:
            out.append([])
            continue
        x = r.numpy()[a:b]  # (b - a, V)
        out.append((1.0 / np.exp(x - x.max(-1, keepdims=True)).sum(-1)).tolist())
    return out


def draw_tokens(
    logits: torch.Tensor,
    widths: Sequence[int],
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator | None],
    top_ks: Sequence[int] | None = None,
) -> torch.Tensor:
    """x0 (R, W): argmax where a row's temperature is 0, else a categorical draw over its window."""
    x0 = logits.argmax(-1)  # (R, W)
    for i, (n, t) in enumerate(zip(widths, temperatures)):
        if t > 0:
            k = top_ks[i] if top_ks is not None else 0
            x0[i, :n] = sample_tokens(logits[i, :n], t, top_ps[i], generators[i], k)  # (n,)
    return x0


def draw_noise(
    shape: tuple[int, int],
    widths: Sequence[int],
    policies: Sequence[str],
    generators: Sequence[torch.Generator | None],
    device: torch.device,
) -> torch.Tensor | None:
    """Uniform noise (R, W) for the rows whose policy needs it (each from its own generator)."""
    need = [i for i, p in enumerate(policies) if POLICIES[p].needs_noise]
    if not need:
        return None
    noise = torch.zeros(shape, device=device)  # (R, W)
    for i in need:
        noise[i, : widths[i]] = torch.rand(widths[i], generator=generators[i], device=device)
    return noise


def policy_scores(
    probs: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor | None, policies: Sequence[str]
) -> torch.Tensor:
    """Scores (R, W), each row by its own policy (higher = commit sooner)."""
    names = sorted(set(policies))
    if len(names) == 1:
        return POLICIES[names[0]].score(probs, x0, noise).float()  # (R, W)
    score = torch.empty(x0.shape, dtype=torch.float32, device=x0.device)  # (R, W)
    groups = [[i for i, p in enumerate(policies) if p == name] for name in names]
    order = to_device([i for g in groups for i in g], torch.long, x0.device)  # (R,): one upload
    ends = itertools.accumulate(len(g) for g in groups)
    for name, end, g in zip(names, ends, groups):
        idx = order[end - len(g) : end]  # this policy's rows
        # (r, W)
        part = POLICIES[name].score(probs[idx], x0[idx], None if noise is None else noise[idx])
        score[idx] = part.float()
    return score


def choose(
    score: torch.Tensor, masked: torch.Tensor, k: torch.Tensor, tau: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """take (R, W): the k best masked positions of each row, plus every masked one with score >= tau.

    score/masked (R, W), k (R,) long, tau (R,) float (+inf: no threshold rule). Also returns the
    order (R, W) of positions by score, best first (ties: left first)."""
    score = score.masked_fill(~masked, float("-inf"))  # (R, W)
    order = score.argsort(dim=-1, descending=True, stable=True)  # (R, W)
    ranks = torch.arange(score.shape[1], device=score.device).expand_as(order)  # (R, W)
    rank = torch.empty_like(order).scatter_(-1, order, ranks)  # (R, W): rank of each position
    take = (rank < k[:, None]) | (score >= tau[:, None])
    return take & masked, order
