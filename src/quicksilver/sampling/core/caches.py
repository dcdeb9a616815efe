"""Cache modes, chosen once per decoder from a registry: which positions a step runs, which keys and
values it keeps.

- ``none``: every pass runs prompt + live canvas (+ suffix) from scratch.
- ``block`` (exact, block-causal models): complete model blocks before the window are appended to
  the row's KV cache once and never recomputed.
- ``window`` (block-causal models, a decode window narrower than the model block): the block's
  sub-blocks of w positions are decoded in turn; the first step in a model block recomputes it
  from the exact prefix (the finished block before it becomes exact), every later step computes
  only the w window positions (w + 1 with the logit shift: the predictor on the left) and reads the
  block's other positions from the cached keys/values of the last pass that computed them (an
  approximation, measured harmless on the shipped model: docs/LOG.md). Chosen by the decoder when a
  row's window is narrower than the model block.
- ``prefix`` / ``dual`` (Fast-dLLM-style approximations for bidirectional models): at a block start
  (or every ``refresh_every`` steps) one full pass refreshes the cache; in between, ``prefix``
  recomputes the block and everything after it, ``dual`` only the block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ...errors import ConfigError
from ...runtime.segment import Segment

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
        lo, hi = row.block_span()
        seq = row.sequence(row.input_len())  # (n,)
        return Segment(seq, 0, row.P + lo, row.P + hi)


@dataclass(frozen=True)
class BlockCache:
    name: str = "block"

    def segment(self, row: Row) -> Segment:
        assert row.cache is not None and row.model_block is not None
        lo, hi = row.block_span()
        seq = row.sequence(row.input_len())  # (n,)
        start = row.cache.length
        freeze = (row.P + lo) // row.model_block * row.model_block  # the window's model block
        append = max(0, freeze - start)
        return Segment(
            seq[start:], start, row.P + lo - start, row.P + hi - start, row.cache, append
        )


@dataclass(frozen=True)
class WindowCache:
    name: str = "window"

    def segment(self, row: Row) -> Segment:
        assert row.cache is not None and row.model_block is not None
        lo, hi = row.block_span()
        seq = row.sequence(row.input_len())  # (n,)
        a, b, mb = row.P + lo, row.P + hi, row.model_block
        block_start = a // mb * mb
        shift = row.shift
        # a new model block (or a truncated canvas): recompute from the exact prefix
        if row.stale or row.exact != block_start:
            row.cache.truncate(row.exact)
            start, row.exact, row.stale = row.exact, block_start, False
            keep = None
            if shift and a == block_start:  # keep the fixed predictor of the window's first token
                keep = a - 1 - start
            n = int(seq.shape[0]) - start
            return Segment(seq[start:], start, a - start, b - start, row.cache, n, keep=keep)
        if shift and a > block_start:  # the predictor of a is in the block: recompute it too
            return Segment(seq[a - 1 : b], a - 1, 1, b - a + 1, row.cache, 0, overwrite=True)
        return Segment(seq[a:b], a, 0, b - a, row.cache, 0, overwrite=True)


def _refresh_due(row: Row) -> bool:
    due = row.refresh_every > 0 and row.block_steps % row.refresh_every == 0
    return row.stale or row.block_steps == 0 or due


@dataclass(frozen=True)
class ApproximateCache:
    """``prefix`` keeps the keys/values before the block; ``dual`` also those after it."""

    name: str

    def segment(self, row: Row) -> Segment:
        assert row.cache is not None
        lo, hi = row.block_span()
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
    for m in (
        NoCache(),
        BlockCache(),
        WindowCache(),
        ApproximateCache("prefix"),
        ApproximateCache("dual"),
    )
}
CACHE_CHOICES = ("auto", "none", "block", "prefix", "dual")  # ``window`` follows from the window
# decode window per device type when a request names none: measured on the 2-vCPU EPYC
# (docs/LOG.md, 2026-12-01); None = the whole model block (on a GPU a 32-wide step is nearly free)
WINDOW_DEFAULTS: dict[str, int | None] = {"cpu": 8, "cuda": None}


def resolve_window(requested: int | None, model_block: int | None, mode: str, device: str) -> int:
    """The window a row computes: the request's, else the device default, at most the model block;
    only block-causal models with the block cache have one narrower than their block."""
    if model_block is None or mode != "block":
        if requested is not None:
            raise ConfigError("a decode window needs a block-causal model with the block cache")
        return 0
    if requested is None:  # the device default where it fits this model's block, else the block
        w = WINDOW_DEFAULTS.get(device) or model_block
        return w if model_block % w == 0 else model_block
    if model_block % requested:
        raise ConfigError(
            f"window must divide the model's block size {model_block}, got {requested}"
        )
    return requested


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
