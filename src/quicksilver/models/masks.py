"""The attention patterns as masks: which keys a query may see, from absolute positions.

``build_attention_mask`` is the network's rule (bidirectional, block-causal, causal with the verify
layout's draft block); every runtime builds its masks from it or reproduces it (tests).
"""

from __future__ import annotations

import torch


def draft_horizon(q_pos: torch.Tensor, draft_from: torch.Tensor | None) -> torch.Tensor:
    """The verify layout in causal terms: a query in a row's draft block (position >= its
    ``draft_from`` (B,)) sees as far as the block's last position, so causally it attends to the
    whole stream and to the whole block; stream queries keep their own position. q_pos (B, Tq)."""
    if draft_from is None:
        return q_pos
    in_draft = q_pos >= draft_from[:, None]  # (B, Tq)
    last = q_pos.max(-1, keepdim=True).values  # (B, 1): the block ends the row
    return torch.where(in_draft, last, q_pos)


def build_attention_mask(
    pattern: str,
    block_size: int,
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    k_valid: torch.Tensor | None,
    draft_from: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask (B, 1, Tq, Tk), True = may attend, from positions (not tensor indices).

    bidirectional: every valid key; causal: keys at positions <= the query's (a draft block, from
    ``draft_from`` (B,) on, sees the whole row: ``draft_horizon``); block_causal: keys in the query's
    own block or an earlier one (block = position // block_size). Rows with no key at all (padding
    queries) are opened fully so attention never produces NaN; their outputs are unused.
    """
    if pattern == "causal":
        q_pos = draft_horizon(q_pos, draft_from)
    qp = q_pos[:, :, None]  # (B, Tq, 1)
    kp = k_pos[:, None, :]  # (B, 1, Tk)
    if pattern == "bidirectional":
        m = torch.ones(qp.shape[0], qp.shape[1], kp.shape[2], dtype=torch.bool, device=q_pos.device)
    elif pattern == "causal":
        m = kp <= qp
    else:  # block_causal
        m = torch.div(kp, block_size, rounding_mode="floor") <= torch.div(
            qp, block_size, rounding_mode="floor"
        )
    if k_valid is not None:
        m = m & k_valid[:, None, :]
    m = m | ~m.any(-1, keepdim=True)
    return m[:, None]  # (B, 1, Tq, Tk)
