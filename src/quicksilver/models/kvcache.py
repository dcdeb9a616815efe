"""KV caches: preallocated per-layer key/value buffers with a committed length.

A forward pass writes the keys/values of its tokens right after the committed part and attends
over ``[0, length + T)`` of the buffer, so no concatenation happens per step; ``commit`` then keeps
the first ``append`` of them (finished blocks, or every token for AR decoding) and the rest is
overwritten by the next pass. Buffers grow by doubling and their capacity is always a power of two
(at least 64), so exported static-shape steps see few cache shapes. One cache serves a padded batch of B rows
or a single packed sequence (B = 1).

A ``KVPool`` keeps the allocations of finished caches (and those a cache grew out of) for the next
cache of the same shape. Reuse matters for the exported CPU steps: they bind their input buffers to
an allocation's memory once (``step_slots``), and binding costs about as much as a pass of the
shipped model, three to four times per request (docs/LOG.md, 2026-12-02).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

ShapeKey = tuple[int, int, int, int, int, torch.dtype, torch.device]  # layers, B, Hkv, cap, hd, ...


@dataclass
class Allocation:
    """One cache's memory and what was bound to it."""

    kv: torch.Tensor  # (2 * layers, B, Hkv, capacity, hd): keys, then values
    positions: torch.Tensor  # (B, capacity) long
    valid: torch.Tensor  # (B, capacity) bool
    step_slots: dict[object, object] = field(default_factory=dict)  # see ``KVCache.step_slots``
    numpy: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    offset: int | None = None  # first slot in a paged pool's one buffer (runtime/paged.py)
    k: list[torch.Tensor] = field(init=False)  # per layer (B, Hkv, capacity, hd), views of ``kv``
    v: list[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.repoint(self.kv, self.positions, self.valid)

    def repoint(self, kv: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> None:
        """Use new memory of the same shape (a paged pool that grew moves its allocations)."""
        self.kv, self.positions, self.valid = kv, positions, valid
        n = kv.shape[0] // 2
        self.k, self.v = list(kv[:n]), list(kv[n:])

    @property
    def key(self) -> ShapeKey:
        n2, B, n_kv, cap, hd = self.kv.shape
        return (n2 // 2, B, n_kv, cap, hd, self.kv.dtype, self.kv.device)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.positions, self.valid))


class Pool(Protocol):
    """Where caches take memory from: ``KVPool`` (allocations of their own, reused) or a paged
    pool (spans of one buffer, runtime/paged.py)."""

    def take(self, key: ShapeKey) -> Allocation | None: ...

    def give(self, a: Allocation) -> None: ...

    def clear(self) -> None: ...


class KVPool:
    """Free allocations by shape, least recently freed evicted beyond ``max_bytes``. Thread-safe
    (a decoder's caches may be made and freed on different threads)."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        self._free: collections.OrderedDict[int, Allocation] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def take(self, key: ShapeKey) -> Allocation | None:
        with self._lock:
            found = next((i for i, a in self._free.items() if a.key == key), None)
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            a = self._free.pop(found)
            self.bytes -= a.nbytes()
            return a

    def clear(self) -> None:
        """Forget every free allocation (and the step bindings they hold)."""
        with self._lock:
            self._free.clear()
            self.bytes = 0

    def give(self, a: Allocation) -> None:
        with self._lock:
            if a.nbytes() > self.max_bytes:
                return
            self._free[id(a)] = a
            self.bytes += a.nbytes()
            while self.bytes > self.max_bytes:
                _, old = self._free.popitem(last=False)
                self.bytes -= old.nbytes()


FIRST_CAPACITY = 64  # positions of a cache's first buffer; it doubles as the sequence grows


def grown_capacity(capacity: int, need: int) -> int:
    """The capacity a buffer of ``capacity`` positions grows to for ``need`` (a power of two)."""
    cap = capacity
    while cap < need:
        cap = max(2 * cap, FIRST_CAPACITY)
    return cap


class KVCache:
    def __init__(self, pool: Pool | None = None) -> None:
        self.pool = pool
        self._alloc: Allocation | None = None
        # per allocation: buffers an exported step bound to this cache's memory (cpu_backends.py)
        self.step_slots: dict[object, object] = {}
        self.length = 0  # committed positions
        self.cursor: int | None = None  # where the next pass writes (None: right after ``length``)
        # (B, V) raw output at the last committed position
        self.last_logits: torch.Tensor | None = None

    # the allocation's memory, read through it (a paged pool may move it, runtime/paged.py)
    @property
    def kv(self) -> torch.Tensor | None:  # (2 * layers, B, Hkv, capacity, hd): keys, then values
        return None if self._alloc is None else self._alloc.kv

    @property
    def k(self) -> list[torch.Tensor]:  # per layer (B, Hkv, capacity, hd), views of ``kv``
        return [] if self._alloc is None else self._alloc.k

    @property
    def v(self) -> list[torch.Tensor]:
        return [] if self._alloc is None else self._alloc.v

    @property
    def positions(self) -> torch.Tensor | None:  # (B, capacity) long
        return None if self._alloc is None else self._alloc.positions

    @property
    def valid(self) -> torch.Tensor | None:  # (B, capacity) bool
        return None if self._alloc is None else self._alloc.valid

    @property
    def offset(self) -> int | None:
        """The first slot of this cache in a paged pool's buffer (None: memory of its own)."""
        return None if self._alloc is None else self._alloc.offset

    @property
    def capacity(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[1])

    def reserve(
        self,
        n_layers: int,
        B: int,
        n_kv: int,
        hd: int,
        need: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Make room for ``need`` positions (keeps what is committed)."""
        if need <= self.capacity:
            return
        cap = grown_capacity(self.capacity, need)
        L = self.length
        key = (n_layers, B, n_kv, cap, hd, dtype, torch.device(device))
        a = self.pool.take(key) if self.pool is not None else None
        if a is None:  # fresh memory; a pooled allocation's stale tail is never read
            a = Allocation(
                torch.zeros((2 * n_layers, B, n_kv, cap, hd), dtype=dtype, device=device),
                torch.zeros((B, cap), dtype=torch.long, device=device),
                torch.zeros((B, cap), dtype=torch.bool, device=device),
            )
        if L:
            assert self.kv is not None and self.positions is not None and self.valid is not None
            a.kv[:, :, :, :L] = self.kv[:, :, :, :L]
            a.positions[:, :L] = self.positions[:, :L]
            a.valid[:, :L] = self.valid[:, :L]
        self._give_back()
        self._use(a)

    def _use(self, a: Allocation | None) -> None:
        self._alloc = a
        self.step_slots = {} if a is None else a.step_slots

    def move_to(self, pool: Pool) -> None:
        """Keep what is committed, in memory from ``pool`` from now on (a paged pool's buffer)."""
        if self.pool is pool:
            return
        old, old_pool, L = self._alloc, self.pool, self.length
        self.pool, self._alloc, self.length = pool, None, 0
        if old is not None:
            n2, B, n_kv, cap, hd = old.kv.shape
            self.reserve(n2 // 2, B, n_kv, hd, cap, old.kv.dtype, old.kv.device)
            assert self._alloc is not None
            self._alloc.kv[:, :, :, :L] = old.kv[:, :, :, :L]
            self._alloc.positions[:, :L] = old.positions[:, :L]
            self._alloc.valid[:, :L] = old.valid[:, :L]
            if old_pool is not None:
                old_pool.give(old)
        self.length = L

    def _give_back(self) -> None:
        if self._alloc is not None and self.pool is not None:
            self.pool.give(self._alloc)

    def release(self) -> None:
        """Hand the memory back to the pool (if any) and empty the cache; it may be used again."""
        self._give_back()
        self._use(None)
        self.length, self.cursor, self.last_logits = 0, None, None

    def numpy_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``kv``, ``positions`` and ``valid`` as numpy arrays sharing their memory (CPU; for the
        exported step backends), made once per allocation."""
        a = self._alloc
        assert a is not None
        if a.numpy is None:
            a.numpy = (a.kv.numpy(), a.positions.numpy(), a.valid.numpy())
        return a.numpy

    def write_meta_range(self, start: int, T: int) -> None:
        """Positions ``start .. start + T - 1`` (all valid) for the T tokens about to be written
        after ``length``, through numpy (no torch dispatch: the exported steps' hot path)."""
        _, pos, val = self.numpy_views()
        L = self.length
        pos[:, L : L + T] = np.arange(start, start + T)  # (B, T)
        val[:, L : L + T] = True

    def write_meta(self, positions: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Positions (B, T) (and validity) of the tokens about to be written after ``length``."""
        assert self.positions is not None and self.valid is not None
        T = positions.shape[-1]
        self.positions[:, self.length : self.length + T] = positions
        self.valid[:, self.length : self.length + T] = True if valid is None else valid

    def write(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v (B, Hkv, T, hd) at the cursor (default: after the committed part); return the
        keys/values to attend over: everything committed plus what was just written."""
        T = k.shape[2]
        start = self.length if self.cursor is None else self.cursor
        self.k[layer][:, :, start : start + T] = k
        self.v[layer][:, :, start : start + T] = v
        end = max(self.length, start + T)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # (B, Hkv, L(+T), hd)

    def commit(self, n: int) -> None:
        """Keep the first ``n`` of the positions written by the last pass."""
        self.length += n

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def committed_positions(self) -> torch.Tensor:
        assert self.positions is not None
        return self.positions[:, : self.length]
