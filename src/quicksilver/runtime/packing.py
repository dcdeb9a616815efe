"""How attention runs over a packed batch: per sequence, or in one call per layer.

``forward_segments`` packs the tokens of several sequences into one (1, Ttot, C) row for the
projections and the MLP (linear layers give every token the same bits whatever the batch).
Attention is where a row could see its batch-mates' numerics, so a layout decides how it runs:

- ``per_sequence``: one attention call per sequence on exactly the tensors it would see alone.
- ``batched``: one call per layer for the whole batch, on a padded (R, H, TQ, TK) layout with one
  boolean mask built once per step. Exact batch invariance needs every row's key axis cut into the
  same blocks whatever the batch: the CPU flash kernel processes keys in blocks of 512 (fewer when
  the key axis is shorter), so keys are padded to a multiple of ``KEY_BUCKET`` (capped at the
  model's context, rounded up to 8), and a row alone runs the same padded shape. Query padding and
  other rows never change a row's result (tested). Static bucketed shapes also let a GPU capture
  CUDA graphs.
- ``flex`` (runtime/paged.py): one FlexAttention call per layer over a paged pool that holds every
  row's keys, no padding of rows, no copies (the GPU default).

On a GPU the per-sequence SDPA calls never go to cuDNN (``sdpa_backends``): its plan per new key
length made per-sequence bf16 decoding 10x slower than batched on an H200 (docs/LOG.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..models.kvcache import KVCache

KEY_BUCKET = 512  # keys per block of the CPU flash-attention kernel
QUERY_BUCKET = 16


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def token_bucket(n: int) -> int:
    """Packed tokens of a step under static shapes: the next power of two, at least 64."""
    return max(64, 1 << (n - 1).bit_length())


def key_length(need: int, max_seq_len: int) -> int:
    """The padded key axis for a step whose longest row attends over ``need`` keys."""
    return max(need, min(round_up(need, KEY_BUCKET), round_up(max_seq_len, 8)))


class AttendFn(Protocol):
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor: ...


class Layout(Protocol):
    def attend(
        self, attend: AttendFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor:
        """q (1, H, Ttot, hd), k/v (1, Hkv, Ttot, hd) of the packed tokens -> (1, H, Ttot, hd)."""
        ...


@dataclass
class PerSequence:
    spans: list[tuple[int, int]]  # each sequence's [start, end) in the packed tokens
    caches: list[KVCache | None]
    masks: list[torch.Tensor | None]  # each (1, 1, T_i, L_i + T_i), or None: all visible

    def attend(
        self, attend: AttendFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor:
        if len(self.spans) == 1 and self.caches[0] is None:
            return attend(q, k, v, self.masks[0])
        ys = []
        for (s, e), cache, m in zip(self.spans, self.caches, self.masks):
            ki, vi = k[:, :, s:e], v[:, :, s:e]
            if cache is not None:
                ki, vi = cache.write(layer, ki, vi)  # (1, Hkv, L+T_i, hd)
            ys.append(attend(q[:, :, s:e], ki, vi, m))
        return torch.cat(ys, dim=2)  # (1, H, Ttot, hd)


@dataclass
class Batched:
    """One attention call per layer; index and mask built once per step (``plan``)."""

    spans: list[tuple[int, int]]
    caches: list[KVCache | None]
    key_lens: list[int]  # keys each row attends over (cached + this pass's)
    TQ: int
    TK: int
    dest: torch.Tensor  # (Ttot,) long: packed token -> row * TQ + offset
    gather: torch.Tensor  # (Tpad,) long: dest, then 0 for the padding tokens (static shapes)
    mask: torch.Tensor  # (R, 1, TQ, TK) bool

    def attend(
        self, attend: AttendFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int
    ) -> torch.Tensor:
        R, H, hd = len(self.spans), q.shape[1], q.shape[3]
        Hkv = k.shape[1]
        K = k.new_zeros(R, Hkv, self.TK, hd)  # (R, Hkv, TK, hd)
        V = v.new_zeros(R, Hkv, self.TK, hd)
        for i, ((s, e), cache) in enumerate(zip(self.spans, self.caches)):
            ki, vi = k[:, :, s:e], v[:, :, s:e]
            if cache is not None:
                ki, vi = cache.write(layer, ki, vi)  # (1, Hkv, L+T_i, hd)
            K[i, :, : ki.shape[2]] = ki[0]
            V[i, :, : vi.shape[2]] = vi[0]
        Ttot = int(self.dest.shape[0])
        Q = q.new_zeros(H, R * self.TQ, hd).index_copy_(
            1, self.dest, q[0, :, :Ttot]
        )  # (H, R*TQ, hd)
        Q = Q.view(H, R, self.TQ, hd).transpose(0, 1)  # (R, H, TQ, hd)
        y = attend(Q, K, V, self.mask)  # (R, H, TQ, hd)
        y = y.transpose(0, 1).reshape(H, R * self.TQ, hd)  # (H, R*TQ, hd)
        return y.index_select(1, self.gather)[None]  # (1, H, Tpad, hd)


def plan_batched(
    spans: list[tuple[int, int]],
    starts: list[int],
    caches: list[KVCache | None],
    key_lens: list[int],
    mask_fn: MaskFn,
    max_seq_len: int,
    n_tokens: int,
    device: torch.device,
) -> Batched:
    """The padded layout of one step: query/key axes, the scatter index, the (R, 1, TQ, TK) mask.

    ``starts``: each row's first absolute position; ``key_lens``: how many keys it attends over
    (its cache's positions say where the cached ones sit); ``n_tokens``: the packed length, padding
    included."""
    R = len(spans)
    TQ = round_up(max(e - s for s, e in spans), QUERY_BUCKET)
    TK = key_length(max(key_lens), max_seq_len)
    q_pos = torch.zeros(R, TQ, dtype=torch.long, device=device)  # (R, TQ)
    k_pos = torch.zeros(R, TK, dtype=torch.long, device=device)  # (R, TK)
    k_valid = torch.zeros(R, TK, dtype=torch.bool, device=device)  # (R, TK)
    dest = []
    for i, ((s, e), start, cache, n) in enumerate(zip(spans, starts, caches, key_lens)):
        T = e - s
        q_pos[i, :T] = torch.arange(start, start + T, device=device)
        if cache is None:
            k_pos[i, :n] = q_pos[i, :T]
        else:
            assert cache.positions is not None
            k_pos[i, :n] = cache.positions[0, :n]
        k_valid[i, :n] = True
        dest.append(torch.arange(i * TQ, i * TQ + T, device=device))
    mask = mask_fn(q_pos, k_pos, k_valid)  # (R, 1, TQ, TK)
    flat = torch.cat(dest)  # (Ttot,)
    pad = torch.zeros(n_tokens - int(flat.shape[0]), dtype=torch.long, device=device)
    return Batched(spans, caches, key_lens, TQ, TK, flat, torch.cat((flat, pad)), mask)


class MaskFn(Protocol):
    def __call__(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor
    ) -> torch.Tensor: ...


LAYOUTS = ("per_sequence", "batched", "flex")  # flex: runtime/paged.py

# SDPA kernels for attention whose shapes change every step: all but cuDNN's, which builds (and
# caches) an execution plan per new shape, 23-37 ms of host each on an sm90 GPU where torch puts it
# first for masked bf16/fp16 calls (docs/LOG.md, 2026-12-08: the per-sequence bf16 pathology)
DYNAMIC_SHAPE_BACKENDS = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
]


def sdpa_backends(device: torch.device, layout: str) -> contextlib.AbstractContextManager[None]:
    """Where a pass's SDPA calls may go: on a GPU under the per-sequence layout (a new key length
    per row and step) never cuDNN (``DYNAMIC_SHAPE_BACKENDS``); elsewhere torch's own choice."""
    if device.type != "cuda" or layout != "per_sequence":
        return contextlib.nullcontext()
    return sdpa_kernel(DYNAMIC_SHAPE_BACKENDS)


def resolve_layout(name: str, device: torch.device) -> str:
    """auto: flex (one call per layer over the paged pool, runtime/paged.py) on a GPU; per sequence
    on a CPU, where padding the key axis costs more than the calls it saves and eager flex
    materialises its scores (measured, docs/LOG.md)."""
    if name == "auto":
        return "flex" if device.type == "cuda" else "per_sequence"
    return name
