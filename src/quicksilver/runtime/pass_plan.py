"""What one verify pass feeds for one row: how many of its drafts, and how many masks behind them.

Verify decoding (sampling/decoders/verify.py) keeps exactly the model's own output whatever a pass feeds;
what to feed is a question of what the runtime's passes cost, so it is answered here, beside the
runtimes. ``RUNTIMES`` holds each runtime's measured defaults (the only hardware numbers of the
decoding path); ``PassPlanner`` applies them to one row with the runtime's cost curve. A runtime
hands out its planner (``Runtime.planner``), chosen by its device and step backend.

At a real size a pass's cost no longer stays flat as it widens: a runtime that measured its pass
times (``Runtime.measure_passes``) caps the drafts a pass feeds at the count that keeps the most
tokens per millisecond (``best_draft_count``), given how often a draft is kept.

A row's plan depends on that row alone, so its tokens never depend on its neighbours in a batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Cost = Callable[[int, int], int]  # (new tokens, how many lead unread) -> cost in positions


def exact(n: int, unread: int = 0) -> int:
    """A pass of n tokens costs n positions (eager torch runs the exact shape)."""
    return n


@dataclass(frozen=True)
class PassPolicy:
    """One runtime's measured answer to "what is worth feeding"."""

    # masks go behind drafts only when the drafts' own probabilities multiply to at least this
    # (masks' drafts assume every draft kept: otherwise they are void)
    mask_gate: float
    # feed at most k positions after the final tokens, so that every decode pass has one shape
    one_shape: bool = False
    # one shape: the drafts fed are the longest prefix whose own probabilities multiply to at
    # least this, leaving at least ``min_masks`` positions to the masks
    draft_odds: float = 0.3
    min_masks: int = 2
    # the most positions a pass feeds after the final tokens when its drafts are copied from the
    # row's context (sampling/decoders/copy_drafts.py): long runs of them are kept in one pass
    copy_width: int = 32


# Measured on the 2-vCPU AMD EPYC Zen 4 VM (avx512_bf16, no AMX) and an H200; docs/LOG.md,
# 2026-12-02 and 2026-12-03.
RUNTIMES: dict[str, PassPolicy] = {
    # small batches compute n + 1 and n + 1 + k positions in about the same time: masks always
    "accelerator": PassPolicy(mask_gate=0.0),
    # eager torch on a CPU is compute-bound: a pass of n + 1 positions costs ~0.6 of n + 1 + k
    "cpu": PassPolicy(mask_gate=0.8),
    # an exported CPU step compiles each shape with its own copy of the weights; a row
    # alternating between 1 + k and 1 + 2k keeps neither in cache (the shipped model's
    # 9-position pass ~0.65 ms alone, ~1.1 ms alternating with the 17-position one)
    # (copied drafts: 1 + 31 positions fill the 32-token shape, warmed at every cache capacity)
    "cpu-exported": PassPolicy(
        mask_gate=0.8, one_shape=True, draft_odds=0.3, min_masks=2, copy_width=31
    ),
}


# how often a greedy draft is kept given the ones before it: the shipped model keeps 3.16 tokens a
# pass at k = 8 on the suite (docs/MODEL.md), and 1 + a + ... + a^8 = 3.16 at a = 0.7
DRAFT_ACCEPT = 0.7


def expected_tokens(k: int, accept: float = DRAFT_ACCEPT) -> float:
    """Tokens a verify pass keeps on average with ``k`` drafts fed: the final token, then each
    draft while every one before it was kept (1 + a + ... + a^k)."""
    return sum(accept**i for i in range(k + 1))


def best_draft_count(pass_ms: Mapping[int, float], accept: float = DRAFT_ACCEPT) -> int:
    """The draft count k whose pass (``pass_ms[k]``: measured milliseconds of a 1 + k position
    pass against a cache) keeps the most tokens per millisecond."""
    return max(sorted(pass_ms), key=lambda k: expected_tokens(k, accept) / pass_ms[k])


@dataclass(frozen=True)
class PassPlanner:
    """A runtime's policy and cost curve, applied to one row's pass at a time; ``max_drafts`` is
    the cap its measured pass times put on a pass's drafts and masks (None: k as asked)."""

    policy: PassPolicy
    cost: Cost = exact
    max_drafts: int | None = None

    def fit_drafts(self, conf: Sequence[float], width: int) -> int:
        """How many drafts a pass of ``width`` positions feeds, given their own probabilities:
        the longest prefix whose product reaches ``draft_odds``, at most ``width - min_masks``
        (the rest are masks), and at least one."""
        n, odds = 0, 1.0
        for c in conf[: max(1, width - self.policy.min_masks)]:
            odds *= c
            if odds < self.policy.draft_odds:
                break
            n += 1
        return max(1, n)

    def plan(
        self,
        conf: Sequence[float],
        k: int,
        room: int,
        fed: int,
        unread: int,
        width: int | None = None,
    ) -> tuple[int, int]:
        """(drafts fed, masks) for a row holding drafts of own probabilities ``conf``, drafting
        ``k`` a pass, with ``room`` canvas positions after its next final token, feeding ``fed``
        uncached tokens before its drafts (the first ``unread`` without their logits read);
        ``width``: the most positions after the final tokens on one shape (default k).

        Where the runtime runs shape buckets, masks are kept only while each adds at most two
        positions' cost: 8 masks must not move a 25-token prompt from the 32 shape into 64."""
        if self.max_drafts is not None and width is None:
            k = min(k, self.max_drafts)  # copied drafts (a width given) keep their long runs
        n, width = len(conf), k if width is None else width
        if n and self.policy.one_shape:
            n = self.fit_drafts(conf, width)
        space = room - n
        if self.policy.one_shape:
            space = min(space, width - n)
        elif n and math.prod(conf) < self.policy.mask_gate:
            return n, 0
        m = max(0, min(k, space))
        alone = self.cost(fed + n, unread)
        while m and self.cost(fed + n + m, unread) - alone > 2 * m:
            m -= 1
        return n, m
