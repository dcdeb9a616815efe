"""The step's hooks: revision (batched, on the device), stops (host), constraints (off the fast path).

- ``revision_inputs`` / ``remask``: committed tokens whose confidence fell below the row's
  ``revise_threshold`` are re-masked (at most ``max_revisions`` times per position, never a stop
  token or a prefilled one), for every row of the batch in one expression.
- ``editing_inputs`` / ``rewrite``: editing (LLaDA2.1's token-to-token step). A committed token
  of the block being decoded becomes the step's drawn token where that differs and its probability
  exceeds the row's ``editing_threshold`` (never a prefilled token, a stop token that ended the
  canvas, or one of a constrained row, whose commits go through its constraint).
- ``apply_stop``: honest length. Once a stop token is committed the canvas ends after it: later
  positions are dropped from the input and never returned.
- ``Constraint`` / ``commit_constrained``: structured output. A constrained row's logits are masked
  by its constraint and its commits are asked one by one, in score order; this reads the device
  and is the one part of a step allowed more than one transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from .state import Row


class CanvasRow(Protocol):
    """What a constraint reads of a row: its canvas (N,) and which positions are committed (N,)."""

    canvas: torch.Tensor
    committed: torch.Tensor


class Constraint(Protocol):
    """Restricts what a row may commit (structured output, tool arguments).

    ``mask_logits`` gets the window's logits (hi - lo, V) and returns them with forbidden tokens at
    -inf; ``allow`` is asked before each commit, in score order, with the canvas as committed so
    far. At the leftmost masked position some token must be allowed, so decoding always progresses.
    """

    def mask_logits(self, row: CanvasRow, lo: int, logits: torch.Tensor) -> torch.Tensor: ...

    def allow(self, row: CanvasRow, pos: int, token: int) -> bool: ...


class ConstrainedRow(CanvasRow, Protocol):
    """What ``commit_constrained`` reads of a row: its canvas, its constraint, and the canvas
    positions [lo, hi) its step decides (a ``Row``'s block, a noise canvas)."""

    constraint: Constraint | None

    def block_span(self) -> tuple[int, int]: ...


# ---- revision ---------------------------------------------------------------------------------
def revision_inputs(row: Row, cur: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Which of the window's positions (tokens ``cur`` (n,)) may be re-masked, and the bound.

    A row without revision gets no eligible position and the bound 0 (no probability is below it)."""
    lo, hi = row.block_span()
    if not row.revising:
        return torch.zeros_like(cur, dtype=torch.bool), 0.0
    assert row.cfg.revise_threshold is not None
    # (n,)
    eligible = (
        (row.revisions[lo:hi] < row.cfg.max_revisions)
        & ~torch.isin(cur, row.stop_tensor)
        & ~row.fixed[lo:hi]
    )
    return eligible, float(row.cfg.revise_threshold)


def remask(
    probs: torch.Tensor,
    cur: torch.Tensor,
    masked: torch.Tensor,
    eligible: torch.Tensor,
    bound: torch.Tensor,
) -> torch.Tensor:
    """Committed, eligible positions whose current token's probability fell below the row's bound.

    probs (R, W, V), cur (R, W) tokens on the canvas, masked/eligible (R, W), bound (R,) -> (R, W)."""
    idx = cur.clamp_max(probs.shape[-1] - 1)[..., None]  # (R, W, 1)
    p_cur = probs.gather(-1, idx).squeeze(-1)  # (R, W)
    return eligible & ~masked & (p_cur < bound[:, None])


# ---- editing ----------------------------------------------------------------------------------
def editing_inputs(row: Row, cur: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Which of the window's positions (tokens ``cur`` (n,)) editing may rewrite, and its bound
    (1.0 for a row that does not edit: no probability exceeds it)."""
    lo, hi = row.block_span()
    if not row.editing or row.constraint is not None:
        return torch.zeros_like(cur, dtype=torch.bool), 1.0
    assert row.cfg.editing_threshold is not None
    editable = ~row.fixed[lo:hi]  # (n,)
    if row.cfg.stop_at_eos:  # a committed stop token has ended the canvas: it stays
        editable &= ~torch.isin(cur, row.stop_tensor)
    return editable, float(row.cfg.editing_threshold)


def rewrite(
    probs: torch.Tensor,
    x0: torch.Tensor,
    cur: torch.Tensor,
    editable: torch.Tensor,
    bound: torch.Tensor,
) -> torch.Tensor:
    """Committed, editable positions whose drawn token differs from the canvas's and is more
    probable than the row's bound.

    probs (R, W, V), x0/cur (R, W) tokens drawn / on the canvas, editable (R, W) (committed ones
    only), bound (R,) -> (R, W)."""
    p_x0 = probs.gather(-1, x0[..., None]).squeeze(-1)  # (R, W)
    return editable & (x0 != cur) & (p_x0 > bound[:, None])


# ---- stops ------------------------------------------------------------------------------------
def apply_stop(row: Row, committed: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """End the canvas after the earliest committed stop token; return the commits that remain."""
    if not row.cfg.stop_at_eos:
        return committed
    stops = [p for p, t in committed if t in row.stop_ids]
    if not stops or (row.stop_pos is not None and min(stops) >= row.stop_pos):
        return committed
    row.stop_pos = min(stops)
    row.truncate(row.stop_pos + 1)
    return [(p, t) for p, t in committed if p < row.end]


# ---- constraints ------------------------------------------------------------------------------
def commit_constrained(
    row: ConstrainedRow,
    order: torch.Tensor,
    take: Sequence[bool],
    tokens: Sequence[int],
    logits: torch.Tensor,
) -> list[tuple[int, int]]:
    """Commit the chosen window positions (take/tokens of length n) in score order (order (n,)),
    each only if the constraint allows it; if none is allowed, the leftmost masked position gets
    the best allowed token (logits (n, V)). Writes the device canvas as it goes (``allow`` reads it)."""
    assert row.constraint is not None
    lo = row.block_span()[0]
    committed: list[tuple[int, int]] = []
    for i in order.tolist():
        if not take[i]:
            continue
        pos, tok = lo + i, tokens[i]
        if row.constraint.allow(row, pos, tok):
            row.canvas[pos], row.committed[pos] = tok, True
            committed.append((pos, tok))
    now = ~row.committed[lo : lo + len(take)]  # masked now (revision may open holes)
    if committed or not bool(now.any()):
        return committed
    i = int(now.nonzero()[0])  # nothing allowed: the leftmost masked position, best allowed token
    for tok in logits[i].argsort(descending=True).tolist():
        if logits[i, tok] == float("-inf"):
            break
        if row.constraint.allow(row, lo + i, tok):
            row.canvas[lo + i], row.committed[lo + i] = tok, True
            return [(lo + i, tok)]
    raise RuntimeError(f"constraint allows no token at canvas position {lo + i}")
