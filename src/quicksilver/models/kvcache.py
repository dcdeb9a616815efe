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
        self.k: list[torch.Tensor] = []  # per layer (B, Hkv, capacity, hd)
        self.v: list[torch.Tensor] = []
        self.positions: torch.Tensor | None = None  # (B, capacity) long
        self.valid: torch.Tensor | None = None  # (B, capacity) bool
        self._numpy: tuple[list[np.ndarray], list[np.ndarray]] | None = None
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

        ks, vs = [], []
        for li in range(n_layers):
            k = torch.zeros((B, n_kv, cap, hd), dtype=dtype, device=device)
            v = torch.zeros((B, n_kv, cap, hd), dtype=dtype, device=device)
            if L:
                k[:, :, :L] = self.k[li][:, :, :L]
                v[:, :, :L] = self.v[li][:, :, :L]
            ks.append(k)
            vs.append(v)
        pos = torch.zeros((B, cap), dtype=torch.long, device=device)
        val = torch.zeros((B, cap), dtype=torch.bool, device=device)
        if L:
            assert self.positions is not None and self.valid is not None
            pos[:, :L] = self.positions[:, :L]
            val[:, :L] = self.valid[:, :L]
        self.k, self.v, self.positions, self.valid = ks, vs, pos, val
        self._numpy = None
        self.step_slots = {}

    def numpy_views(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The key and value buffers as numpy arrays sharing their memory (CPU; for the exported
        step backends), made once per allocation."""
        if self._numpy is None:
            self._numpy = (
                [k.detach().numpy() for k in self.k],
                [v.detach().numpy() for v in self.v],
            )
        return self._numpy

    def write_meta_range(self, start: int, T: int) -> None:
        """Positions ``start .. start + T - 1`` (all valid) for the T tokens about to be written
        after ``length``, through numpy (no torch dispatch: the exported steps' hot path)."""
        assert self.positions is not None and self.valid is not None
        L = self.length
        self.positions.numpy()[:, L : L + T] = np.arange(start, start + T)  # (B, T)
        self.valid.numpy()[:, L : L + T] = True

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
