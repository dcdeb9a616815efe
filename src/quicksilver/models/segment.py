"""What one forward pass is asked to do: a sequence's ``Segment`` of a packed pass, the attention
mask its positions imply, and the ``StepBackend`` protocol for runtimes that serve single-segment
passes outside torch (models/cpu_backends.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .kvcache import KVCache
from .pass_plan import PassPolicy


@dataclass
class Segment:
    """One sequence's share of a packed forward pass.

    ``ids`` (T,) are the tokens after whatever ``cache`` already holds, at absolute positions
    ``start .. start + T - 1`` (a host int, so building the pass never reads the device); the first
    ``append`` of them are added to the cache; logits are returned for tokens ``[lo, hi)``.
    """

    ids: torch.Tensor  # (T,) long
    start: int
    lo: int
    hi: int
    cache: KVCache | None = None
    append: int = 0
    overwrite: bool = (
        False  # the tokens replace cached positions (dual cache) instead of following them
    )
    keep: int | None = None  # logit shift: which token's raw output becomes cache.last_logits
    # (default: the last appended one; negative: leave last_logits as it is)
    draft: int = (
        0  # the last ``draft`` tokens are a draft block (causal models, the verify layout):
    )
    # they see every token of the segment and the cache, the tokens before them never see them

    @property
    def draft_from(self) -> int | None:
        """Absolute position of the draft block's first token, if the segment has one."""
        return self.start + self.length - self.draft if self.draft else None

    def kept(self) -> int | None:
        """Index of the token whose raw output the cache keeps after this pass, if any."""
        idx = self.append - 1 if self.keep is None else self.keep
        return idx if self.append and idx >= 0 else None

    @property
    def length(self) -> int:
        return int(self.ids.shape[0])

    @property
    def positions(self) -> torch.Tensor:
        return torch.arange(self.start, self.start + self.length, device=self.ids.device)  # (T,)


class StepBackend(Protocol):
    """Serves one sequence's passes in another runtime (models/cpu_backends.py); None = not covered."""

    name: str
    pass_policy: PassPolicy  # what a verify pass should feed on it (models/pass_plan.py)

    def forward_segment(self, seg: Segment) -> torch.Tensor | None: ...

    def forward_each(self, segs: list[Segment]) -> list[torch.Tensor | None]:
        """``forward_segment`` of each segment alone, in whatever order runs fastest."""
        ...

    def cost(self, n: int, unread: int = 0) -> int:
        """What a single-segment pass of ``n`` new tokens costs, in positions: those its shape
        buckets compute, plus a fixed cost for each extra pass it is split into (the first
        ``unread`` tokens are appended without their logits read and may run apart)."""
        ...

    def warm(self, max_len: int) -> int:
        """Prepare the shapes sequences of up to ``max_len`` positions use; how many it did."""
        ...


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
