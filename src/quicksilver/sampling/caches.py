"""Cache modes, chosen once per decoder from a registry: which positions a step runs, which keys and
values it keeps.

- ``none``: every pass runs prompt + live canvas (+ suffix) from scratch.
- ``block`` (exact, block-causal models): complete model blocks before the window are appended to
  the row's KV cache once and never recomputed.
- ``prefix`` / ``dual`` (Fast-dLLM-style approximations for bidirectional models): at a block start
  (or every ``refresh_every`` steps) one full pass refreshes the cache; in between, ``prefix``
  recomputes the block and everything after it, ``dual`` only the block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError
from ..models.transformer import Segment

if TYPE_CHECKING:
    from .state import Row


class CacheMode(Protocol):
    @property
    def name(self) -> str: ...

    def segment(self, row: Row) -> Segment:
        """The row's share of the next forward pass."""
        ...


@dataclass(frozen=True)
class NoCache:
    name: str = "none"

    def segment(self, row: Row) -> Segment:
        lo, hi = row.window()
        seq = row.sequence(row.input_len())  # (n,)
        return Segment(seq, 0, row.P + lo, row.P + hi)


@dataclass(frozen=True)
class BlockCache:
    name: str = "block"

    def segment(self, row: Row) -> Segment:
        assert row.cache is not None and row.model_block is not None
        lo, hi = row.window()
        seq = row.sequence(row.input_len())  # (n,)
        start = row.cache.length
        freeze = (row.P + lo) // row.model_block * row.model_block  # the window's model block
        append = max(0, freeze - start)
        return Segment(
            seq[start:], start, row.P + lo - start, row.P + hi - start, row.cache, append
        )


def _refresh_due(row: Row) -> bool:
    due = row.refresh_every > 0 and row.block_steps % row.refresh_every == 0
    return row.stale or row.block_steps == 0 or due


@dataclass(frozen=True)
class ApproximateCache:
    """``prefix`` keeps the keys/values before the block; ``dual`` also those after it."""

    name: str

    def segment(self, row: Row) -> Segment:
        assert row.cache is not None
        lo, hi = row.window()
        seq = row.sequence(row.input_len())  # (n,)
        n = int(seq.shape[0])
        if _refresh_due(row):
            row.cache.truncate(0)
            row.stale = False
            keep = row.P + lo if self.name == "prefix" else n
            return Segment(seq, 0, row.P + lo, row.P + hi, row.cache, keep)
        if self.name == "prefix":
            start = row.cache.length
            return Segment(seq[start:], start, row.P + lo - start, row.P + hi - start, row.cache, 0)
        a, b = row.P + lo, row.P + hi
        return Segment(seq[a:b], a, 0, b - a, row.cache, 0, overwrite=True)


CACHE_MODES: dict[str, CacheMode] = {
    m.name: m
    for m in (NoCache(), BlockCache(), ApproximateCache("prefix"), ApproximateCache("dual"))
}
CACHE_CHOICES = ("auto", *CACHE_MODES)


def resolve_cache_mode(attention: str, requested: str, use_cache: bool = True) -> str:
    """auto: the exact block cache for block-causal models, no cache for the others."""
    if requested not in CACHE_CHOICES:
        raise ConfigError(f"cache mode must be one of {CACHE_CHOICES}, got {requested!r}")
    if not use_cache or attention == "causal":
        return "none"
    mode = requested
    if mode == "auto":
        mode = "block" if attention == "block_causal" else "none"
    if mode == "block" and attention != "block_causal":
        raise ConfigError("the exact block cache needs a block-causal model; use prefix or dual")
    if mode in ("prefix", "dual") and attention != "bidirectional":
        mode = "block"  # block-causal models have an exact cache: no need to approximate
    return mode
