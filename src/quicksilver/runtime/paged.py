"""The ``flex`` attention layout: every row's keys and values in one paged buffer, attention through
FlexAttention block masks, one call per layer for the whole packed batch.

Contract:

- ``PagedPool`` is a ``Pool`` (models/kvcache.py) whose allocations are spans of ONE buffer per
  runtime, ``kv`` (2 * layers, 1, Hkv, slots, hd), with ``positions`` / ``valid`` (1, slots) beside
  it. A cache asks for a power-of-two capacity of at least ``PAGE`` slots (kvcache.grown_capacity)
  and gets an aligned span of pages from a buddy allocator, so its table of pages is the run
  ``offset // PAGE ..``; a full buffer doubles (offsets kept, every live cache repointed). The last
  page is scratch: where the padding tokens of a static-shape pass write, never read.
- ``plan_flex`` turns a step's segments into a ``Flex`` layout: where each packed token's key and
  value go (``dest``, one ``index_copy_`` per layer for every row: no per-row writes, no padding
  of rows to a common length, no copies of caches), and a ``BlockMask`` whose KV block is the page:
  query block j lists the pages of the rows its tokens belong to, and ``mask_mod`` keeps, per query,
  the keys of its own row's span (``lo <= slot < hi``) that the pattern allows.
- Patterns (``mask_mod``): bidirectional; block_causal (block = position // block_size); causal,
  where a verify row's draft block sees its whole row (``models/masks.draft_horizon``, applied on
  the host to the query positions); and every pattern with a per-query floor position (sliding
  windows: DiffusionGemma's noise canvas sees the last ``window - 1`` cached positions). The same
  rule as ``models/masks.build_attention_mask`` (tests compare them).
- A row's numbers do not depend on its batch-mates: its keys sit page-aligned, so the kernel cuts
  them into the same blocks wherever the row lives, and other rows' pages in a query block are
  fully masked for it (a no-op in the online softmax). Tested bit-equal on the CPU.
- ``flex_kernel``: ``torch.compile(flex_attention)`` on a GPU (the packed tokens padded to
  ``packing.token_bucket``, the buffer's size fixed until it doubles: a second shape recompiles it
  with dynamic sizes, inductor's CPU template fails there, docs/LOG.md), eager elsewhere (the
  unfused reference: tests). ``flex_layout`` builds the block mask from the step's one upload
  without host reads, so a whole step can be captured (runtime.Runtime.compile_step).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from torch.utils._python_dispatch import _len_torch_dispatch_stack, _pop_mode_temporarily

from ..models.host import to_device
from ..models.kvcache import Allocation, ShapeKey

PAGE = 64  # slots per page = the KV block of the block mask = a cache's smallest capacity
Q_BLOCK = 128  # packed query tokens per block of the block mask
FIRST_PAGES = 16  # pages of a fresh pool's buffer (it doubles when full)

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class PagedPool:
    """One KV buffer for every cache of a runtime (see the module docstring)."""

    def __init__(
        self,
        n_layers: int,
        n_kv: int,
        hd: int,
        dtype: torch.dtype,
        device: torch.device,
        pages: int = FIRST_PAGES,
    ) -> None:
        self.shape = (n_layers, 1, n_kv, hd, dtype, torch.device(device))
        self.pages = 0  # pages of the buddy allocator (a power of two); the scratch page follows
        self._free: dict[int, set[int]] = {}  # span size in pages -> free first pages
        # first slot -> (allocation, its slots): caches dropped without ``release`` are reclaimed
        self._live: dict[int, tuple[weakref.ref[Allocation], int]] = {}
        self.kv = torch.empty(0)
        self.positions = torch.empty(0)
        self.valid = torch.empty(0)
        self.static = False  # captured steps (Runtime.compile_step) write the buffer in place
        self._grow(pages)

    @property
    def slots(self) -> int:
        """The key axis of every pass: the allocator's slots plus the scratch page."""
        return (self.pages + 1) * PAGE

    @property
    def scratch(self) -> int:
        return self.pages * PAGE

    def _grow(self, pages: int) -> None:
        """Make the buffer ``pages`` pages (a power of two) long, keeping every span where it is."""
        n_layers, _, n_kv, hd, dtype, dev = self.shape
        old, old_pages = (self.kv, self.positions, self.valid), self.pages
        slots = (pages + 1) * PAGE
        self.kv = torch.zeros((2 * n_layers, 1, n_kv, slots, hd), dtype=dtype, device=dev)
        self.positions = torch.zeros((1, slots), dtype=torch.long, device=dev)
        self.valid = torch.zeros((1, slots), dtype=torch.bool, device=dev)
        if old_pages:
            n = old_pages * PAGE
            self.kv[:, :, :, :n] = old[0][:, :, :, :n]
            self.positions[:, :n], self.valid[:, :n] = old[1][:, :n], old[2][:, :n]
        if old_pages:
            size = old_pages
            while size < pages:  # the new upper half, as one free span per doubling
                self._free.setdefault(size, set()).add(size)
                size *= 2
        else:
            self._free[pages] = {0}
        self.pages = pages
        self._merge(old_pages)
        if self.static:
            self.mark_static()
        for off, (ref, cap) in self._live.items():
            a = ref()
            if a is not None:
                a.repoint(*self._views(off, cap))

    def mark_static(self) -> None:
        """Tell torch.compile the buffer's address is fixed (CUDA graphs then replay the in-place
        writes instead of refusing a graph whose inputs it mutates); a grown buffer is marked too."""
        self.static = True
        for t in (self.kv, self.positions):
            torch._dynamo.mark_static_address(t)

    def _merge(self, size: int) -> None:
        """Join the free span that ended the old buffer with its new buddy, upwards."""
        while 0 < size < self.pages and {0, size} <= self._free.get(size, set()):
            self._free[size] -= {0, size}
            self._free.setdefault(2 * size, set()).add(0)
            size *= 2

    def _views(self, off: int, cap: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (
            self.kv[:, :, :, off : off + cap],  # (2L, 1, Hkv, cap, hd)
            self.positions[:, off : off + cap],  # (1, cap)
            self.valid[:, off : off + cap],
        )

    def _split(self, size: int) -> int | None:
        """The first page of a free span of ``size`` pages, splitting a larger one if needed."""
        have = size
        while have <= self.pages and not self._free.get(have):
            have *= 2
        if have > self.pages:
            return None
        first = self._free[have].pop()
        while have > size:
            have //= 2
            self._free.setdefault(have, set()).add(first + have)
        return first

    def take(self, key: ShapeKey) -> Allocation | None:
        """A span for a cache of shape ``key``; None for shapes of another pool (B > 1 etc.)."""
        n_layers, B, n_kv, cap, hd, dtype, dev = key
        if (n_layers, B, n_kv, hd, dtype, torch.device(dev)) != self.shape or cap % PAGE:
            return None
        size = cap // PAGE
        first = self._split(size)
        if first is None:
            self._reclaim()
            first = self._split(size)
        while first is None:
            self._grow(max(2 * self.pages, size))
            first = self._split(size)
        off = first * PAGE
        a = Allocation(*self._views(off, cap), offset=off)
        self._live[off] = (weakref.ref(a), cap)
        return a

    def _reclaim(self) -> None:
        """Free the spans of allocations nobody holds any more."""
        for off, (ref, cap) in list(self._live.items()):
            if ref() is None:
                self._free_span(off, cap)

    def give(self, a: Allocation) -> None:
        """Free ``a``'s span, joining it with its free buddy as far as it goes."""
        if a.offset is not None:
            self._free_span(a.offset, a.kv.shape[3])

    def _free_span(self, off: int, cap: int) -> None:
        if self._live.pop(off, None) is None:
            return
        first, size = off // PAGE, cap // PAGE
        while size < self.pages and (first ^ size) in self._free.get(size, set()):
            self._free[size].discard(first ^ size)
            first, size = min(first, first ^ size), 2 * size
        self._free.setdefault(size, set()).add(first)

    def clear(self) -> None:
        """Nothing to forget: free spans hold no bindings."""

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s keys and values over every slot, (1, Hkv, slots, hd) each."""
        n = self.kv.shape[0] // 2
        return self.kv[i], self.kv[n + i]

    def live_slots(self) -> int:
        """Slots held by live caches."""
        return sum(cap for ref, cap in self._live.values() if ref() is not None)


def mask_mod(
    pattern: str, block_size: int, meta: torch.Tensor, k_pos: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """The step's ``mask_mod(b, h, q, kv)``. ``meta`` (4, Tq) long per packed query: its position
    (the draft horizon applied), the first and end slot of its row's keys, the lowest key position
    it sees (a sliding window's floor; 0 without one); ``k_pos`` (slots,): each slot's position."""
    q_pos, lo, hi, floor = meta[0], meta[1], meta[2], meta[3]

    def visible(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        kp = k_pos[kv]
        seen = (kv >= lo[q]) & (kv < hi[q]) & (kp >= floor[q])
        if pattern == "causal":
            return seen & (kp <= q_pos[q])
        if pattern == "block_causal":
            return seen & (kp // block_size <= q_pos[q] // block_size)
        return seen

    return visible


@dataclass
class Row:
    """One row of a flex step: its packed tokens, where they go, the keys it sees."""

    span: tuple[int, int]  # packed tokens [a, b)
    start: int  # absolute position of its first token
    write: int  # first slot its tokens' keys/values are written to
    lo: int  # its keys are the slots [lo, hi)
    hi: int
    draft_from: int | None = None  # causal: first position of its draft block
    floor: int = 0  # lowest key position it sees


def host_meta(rows: list[Row], n_tokens: int, scratch: int) -> tuple[list[int], list[int]]:
    """Per packed token (``n_tokens``, padding included): ``dest`` slots, then the mask metadata
    (4 x n_tokens: position, lo, hi, floor), as host lists; padding tokens see no key."""
    dest = [scratch + i % PAGE for i in range(n_tokens)]
    meta = [[0] * n_tokens for _ in range(4)]
    for r in rows:
        a, b = r.span
        T = b - a
        last = r.start + T - 1
        for j in range(T):
            pos = r.start + j
            if r.draft_from is not None and pos >= r.draft_from:
                pos = last
            dest[a + j] = r.write + j
            meta[0][a + j], meta[1][a + j], meta[2][a + j] = pos, r.lo, r.hi
            meta[3][a + j] = r.floor
    return dest, [x for m in meta for x in m]


def block_tables(rows: list[Row], n_tokens: int, n_pages: int) -> tuple[list[int], list[int]]:
    """Per query block: how many pages it reads and which (padded to ``n_pages`` each)."""
    n_q = -(-n_tokens // Q_BLOCK)
    pages: list[set[int]] = [set() for _ in range(n_q)]
    for r in rows:
        a, b = r.span
        if a == b:
            continue
        span = range(r.lo // PAGE, -(-r.hi // PAGE))
        for j in range(a // Q_BLOCK, (b - 1) // Q_BLOCK + 1):
            pages[j].update(span)
    nums = [len(p) for p in pages]
    idx = []
    for p in pages:
        idx += sorted(p) + [0] * (n_pages - len(p))
    return nums, idx


@dataclass
class Flex:
    """The ``Layout`` of a flex step (runtime/packing.py): write, then one attention call per layer."""

    pool: PagedPool
    dest: torch.Tensor  # (Tpad,) long: each packed token's slot
    block_mask: BlockMask
    kernel: Callable[..., torch.Tensor]

    def attend(
        self, attend: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor:
        """q (1, H, Tpad, hd), k/v (1, Hkv, Tpad, hd) -> (1, H, Tpad, hd); ``attend`` unused."""
        kb, vb = self.pool.layer(layer)  # (1, Hkv, slots, hd)
        kb.index_copy_(2, self.dest, k)
        vb.index_copy_(2, self.dest, v)
        gqa = kb.shape[1] != q.shape[1]
        if torch.compiler.is_compiling():  # a captured step (Runtime.compile_step)
            return self.kernel(q, kb, vb, block_mask=self.block_mask, enable_gqa=gqa)
        return outside_modes(self.kernel, q, kb, vb, block_mask=self.block_mask, enable_gqa=gqa)


def outside_modes(fn: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """``fn(*args, **kwargs)`` with any torch dispatch modes (bench/syncs.py's counter) set aside:
    FlexAttention compiles itself, which it refuses under such a mode, and its kernel reads nothing
    back on the host, so a count of host syncs loses nothing."""
    if not _len_torch_dispatch_stack():
        return fn(*args, **kwargs)
    with _pop_mode_temporarily():
        return outside_modes(fn, *args, **kwargs)


def upload_plan(
    pool: PagedPool, rows: list[Row], n_tokens: int, device: torch.device
) -> torch.Tensor:
    """A step's one upload (long): per packed token its slot (Tpad), the mask metadata (4 x Tpad),
    then per query block its page count (nQ) and pages (nQ x pages of the pool)."""
    dest, meta = host_meta(rows, n_tokens, pool.scratch)
    nums, idx = block_tables(rows, n_tokens, pool.slots // PAGE)
    return to_device(dest + meta + nums + idx, torch.long, device)


def flex_layout(
    pool: PagedPool,
    plan: torch.Tensor,
    n_tokens: int,
    pattern: str,
    block_size: int,
    kernel: Callable[..., torch.Tensor],
) -> Flex:
    """The ``Flex`` layout of an uploaded ``plan`` (no host reads: it also runs inside a captured
    step, runtime.Runtime.compile_step)."""
    n_q, n_pages = -(-n_tokens // Q_BLOCK), pool.slots // PAGE
    tok, tables = plan[: 5 * n_tokens], plan[5 * n_tokens :].to(torch.int32)
    kv_num = tables[:n_q].view(1, 1, n_q)  # (1, 1, nQ)
    kv_idx = tables[n_q:].view(1, 1, n_q, n_pages)  # (1, 1, nQ, nPages)
    mod = mask_mod(pattern, block_size, tok[n_tokens:].view(4, n_tokens), pool.positions[0])
    bm = BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        BLOCK_SIZE=(Q_BLOCK, PAGE),
        mask_mod=mod,
        seq_lengths=(n_tokens, pool.slots),
        compute_q_blocks=False,
    )
    return Flex(pool, tok[:n_tokens], bm, kernel)


def plan_flex(
    pool: PagedPool,
    rows: list[Row],
    n_tokens: int,
    pattern: str,
    block_size: int,
    device: torch.device,
) -> Flex:
    """A step's ``Flex`` layout (one upload: the per-token metadata and the block tables)."""
    plan = upload_plan(pool, rows, n_tokens, device)
    return flex_layout(pool, plan, n_tokens, pattern, block_size, flex_kernel(device.type))


@functools.lru_cache(maxsize=4)
def flex_kernel(device_type: str) -> Callable[..., torch.Tensor]:
    """FlexAttention compiled on a GPU (the fused kernel); eager on the CPU (the reference)."""
    if device_type == "cuda":  # static first, then one dynamic recompile (buckets, pool growth)
        return torch.compile(flex_attention)  # type: ignore[return-value]
    return flex_attention  # type: ignore[return-value]
