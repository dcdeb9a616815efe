"""What one forward pass is asked to do: a sequence's ``Segment`` of a packed pass, and the
``StepBackend`` protocol for runtimes that serve single-segment passes outside torch
(runtime/cpu_backends.py, runtime/ov_graph.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..models.kvcache import KVCache
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
    # the tokens replace cached positions (dual cache) instead of following them
    overwrite: bool = False
    keep: int | None = None  # logit shift: which token's raw output becomes cache.last_logits
    # (default: the last appended one; negative: leave last_logits as it is)
    # the last ``draft`` tokens are a draft block (causal models, the verify layout): they see
    # every token of the segment and the cache, the tokens before them never see them
    draft: int = 0

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
    """Serves one sequence's passes in another runtime (runtime/cpu_backends.py); None = not covered."""

    name: str
    pass_policy: PassPolicy  # what a verify pass should feed on it (runtime/pass_plan.py)

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
