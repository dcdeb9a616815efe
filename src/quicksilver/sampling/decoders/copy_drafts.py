"""Copy drafts: a verify row's drafts taken from its own context where the recent tokens recur.

When the last few final tokens of a row (prompt + reply) occurred earlier in it, the tokens that
followed them there are a draft of what follows now (prompt lookup; Saxena 2023, as in llama.cpp's
and vLLM's n-gram speculation). Apply-edit replies copy most of the original file, tool arguments
quote the conversation, and a long copy is kept in one pass. Drafts are drafts: verification keeps
the output exactly the model's (greedy: the argmax; sampling: a copied token is a point-mass draft,
kept with probability p(token), else a draw from p without it).

Written here, not taken from a library: the index lives inside a row that grows by whole accepted
runs, and the choice between copied and diffused drafts uses that row's measured acceptance.
"""

from __future__ import annotations

MAX_N, MIN_N = 12, 3  # the longest suffix n-gram looked up first, then shorter ones down to MIN_N
# A copied token's chance of being kept before the row has measured its own: 0.08 for each token
# of the matched n-gram, at most 0.95. On the shipped model's general suite matches of 2-6 tokens
# kept 0.02-0.3 of their copied tokens (docs/LOG.md, 2026-12-04): short matches are noise.
PRIOR_PER_TOKEN, PRIOR_MAX, PRIOR_WEIGHT = 0.08, 0.95, 5.0
MEAN_KEPT_PRIOR = 2.0  # drafts a verifying pass keeps, before the row has measured its own
# A copy that repeats every draft the row holds (or follows a pass that left none) extends them:
# it is fed, whatever the pass-rate estimate says, when its n-gram matched at least this many
# tokens and the row keeps at least this share of its copied tokens. The estimate prices a pass
# by its positions, and a copy only at its prior until tried, so a draft head that itself copies
# well (probabilities ~1) always won it; fed, the copies of a file are kept ~32 a pass (apply_edit
# 3.6 -> 4.7 tokens per pass, copy_code 7.3 -> 23.8 on the v4 code-stage model; docs/LOG.md).
EXTEND_MIN_MATCH, EXTEND_GATE = 8, 0.5


class NgramIndex:
    """For every n-gram (MIN_N <= n <= MAX_N) of a growing sequence, the position just after its
    most recent occurrence that has a token after it."""

    def __init__(self, tokens: list[int]) -> None:
        self.seq: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending before this position are in ``after``
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        self.seq.extend(tokens)

    def _index(self) -> None:
        """Index the n-grams ending at every position that now has a token after it."""
        seq = self.seq
        for end in range(self.indexed, len(seq) - 1):  # the n-gram seq[end - n + 1 : end + 1]
            for n in range(MIN_N, MAX_N + 1):
                if end - n + 1 < 0:
                    break
                self.after[tuple(seq[end - n + 1 : end + 1])] = end + 1
        self.indexed = max(self.indexed, len(self.seq) - 1)

    def lookup(self, limit: int) -> tuple[list[int], int]:
        """Up to ``limit`` tokens that followed the longest suffix n-gram's latest earlier
        occurrence, and that n-gram's length; ([], 0) when none recurs."""
        self._index()
        seq = self.seq
        for n in range(min(MAX_N, len(seq)), MIN_N - 1, -1):
            at = self.after.get(tuple(seq[-n:]))
            if at is not None:
                return seq[at : at + limit], n
        return [], 0


def agreement(a: list[int], b: list[int]) -> int:
    """The length of the common prefix of two drafts."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def extends(copy: list[int], drafts: list[int], match: int, rate: float) -> bool:
    """Whether a copy continues every draft held, on a long match the row keeps copies of."""
    return (
        agreement(copy, drafts) == len(drafts) and match >= EXTEND_MIN_MATCH and rate >= EXTEND_GATE
    )


def expected_kept(probs: list[float]) -> float:
    """Drafts expected to be kept, each kept only if all before it were: sum of running products."""
    total, run = 0.0, 1.0
    for p in probs:
        run *= p
        total += run
    return total


def acceptance(kept: int, tried: int, match: int) -> float:
    """A copied token's chance of being kept: the row's measured rate, from a prior that grows with
    the length of the matched n-gram."""
    prior = min(PRIOR_MAX, PRIOR_PER_TOKEN * match)
    return (kept + prior * PRIOR_WEIGHT) / (tried + PRIOR_WEIGHT)


def mean_kept(accepted: list[int]) -> float:
    """Drafts a verifying pass of this row keeps on average (its masks' worth as next drafts)."""
    return (sum(accepted) + MEAN_KEPT_PRIOR) / (len(accepted) + 1)
