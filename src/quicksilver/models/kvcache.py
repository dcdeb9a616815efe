"""KV caches: preallocated per-layer key/value buffers with a committed length.

A forward pass writes the keys/values of its tokens right after the committed part and attends
over ``[0, length + T)`` of the buffer, so no concatenation happens per step; ``commit`` then keeps
the first ``append`` of them (finished blocks, or every token for AR decoding) and the rest is
overwritten by the next pass. Buffers grow by doubling and their capacity is always a power of two
(at least 64), so exported static-shape steps see few cache shapes. One cache serves a padded batch of B rows
or a single packed sequence (B = 1).
"""

from __future__ import annotations

import numpy as np
import torch


class KVCache:
    def __init__(self) -> None:
        self.kv: torch.Tensor | None = None  # (2 * layers, B, Hkv, capacity, hd): keys, then values
        self.k: list[torch.Tensor] = []  # per layer (B, Hkv, capacity, hd), views of ``kv``
        self.v: list[torch.Tensor] = []
        self.positions: torch.Tensor | None = None  # (B, capacity) long
        self.valid: torch.Tensor | None = None  # (B, capacity) bool
        self._numpy: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # per allocation: buffers an exported step bound to this cache's memory (cpu_backends.py)
        self.step_slots: dict[object, object] = {}
        self.length = 0  # committed positions
        self.cursor: int | None = None  # where the next pass writes (None: right after ``length``)
        self.last_logits: torch.Tensor | None = (
            None  # (B, V) raw output at the last committed position
        )

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
        cap = max(2 * self.capacity, 64)
        while cap < need:
            cap *= 2
        L = self.length

        kv = torch.zeros((2 * n_layers, B, n_kv, cap, hd), dtype=dtype, device=device)
        if L:
            for li in range(n_layers):
                kv[li, :, :, :L] = self.k[li][:, :, :L]
                kv[n_layers + li, :, :, :L] = self.v[li][:, :, :L]
        pos = torch.zeros((B, cap), dtype=torch.long, device=device)
        val = torch.zeros((B, cap), dtype=torch.bool, device=device)
        if L:
            assert self.positions is not None and self.valid is not None
            pos[:, :L] = self.positions[:, :L]
            val[:, :L] = self.valid[:, :L]
        self.kv, self.positions, self.valid = kv, pos, val
        self.k, self.v = list(kv[:n_layers]), list(kv[n_layers:])
        self._numpy = None
        self.step_slots = {}

    def numpy_views(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``kv``, ``positions`` and ``valid`` as numpy arrays sharing their memory (CPU; for the
        exported step backends), made once per allocation."""
        if self._numpy is None:
            assert self.kv is not None and self.positions is not None and self.valid is not None
            self._numpy = (self.kv.numpy(), self.positions.numpy(), self.valid.numpy())
        return self._numpy

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
