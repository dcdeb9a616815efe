"""Count device-to-host synchronisations, on any device (CPU included).

``SyncCounter`` is a ``TorchDispatchMode`` that counts the ops that must read a tensor's values on
the host (``aten._local_scalar_dense`` behind ``.item()``/``int()``/``bool()``, ``nonzero`` and
``masked_select``, whose output shape depends on the data, and indexing with a boolean mask, which
is a ``nonzero`` inside on a GPU), and patches ``Tensor.tolist``,
``.cpu``, ``.item`` and ``.numpy`` (which on CPU read memory without dispatching). A patched call
counts once, however many ops it dispatches inside. On a GPU each of these stalls the stream.

The other direction is counted apart, in ``uploads``: every tensor built from Python data
(``aten.lift_fresh`` behind ``torch.tensor(list)``), which on a GPU is a host-to-device copy, and a
full stream sync when it comes from pageable memory; ``models/host.py`` stages the per-step ones in
pinned memory with ``non_blocking=True``. ``blocking_uploads`` counts the copies onto a GPU that
were not (pageable source or a blocking copy); on the CPU it stays 0.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select")
UPLOAD_OPS = ("lift_fresh",)  # a tensor made from Python data: host memory
COPY_OPS = ("_to_copy", "copy_")
INDEX_OPS = ("index", "index_put", "index_put_")  # a sync when an index is a boolean mask
PATCHED = ("tolist", "cpu", "item", "numpy")


def _bool_index(name: str, args: tuple[Any, ...]) -> bool:
    if name not in INDEX_OPS or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])


def _blocking_upload(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A copy from host memory onto a GPU that stalls the stream (pageable source or blocking)."""
    src = args[1] if name == "copy_" else args[0]
    dst = args[0].device if name == "copy_" else kwargs.get("device")
    if not isinstance(src, torch.Tensor) or src.device.type != "cpu" or dst is None:
        return False
    if torch.device(dst).type == "cpu":
        return False
    non_blocking = args[2] if name == "copy_" and len(args) > 2 else kwargs.get("non_blocking")
    return not (non_blocking and src.is_pinned())


class SyncCounter(TorchDispatchMode):
    """``with SyncCounter() as c: ...``; then ``c.total`` and ``c.counts`` (name -> calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.uploads = 0  # tensors built from host data (host-to-device copies on a GPU)
        self.blocking_uploads = 0  # copies onto a GPU from pageable memory or without non_blocking
        self._depth = 0  # > 0 inside a patched method: its inner ops are the same read
        self._saved: dict[str, Callable[..., Any]] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
        self.uploads = self.blocking_uploads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if self._depth == 0 and (name in SYNC_OPS or _bool_index(name, args)):
            self.counts[name] += 1
        self.uploads += name in UPLOAD_OPS and args[0].dim() > 0  # a 0-d scalar is passed by value
        self.blocking_uploads += name in COPY_OPS and _blocking_upload(name, args, kwargs)
        return func(*args, **kwargs)

    def _wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def counted(t: torch.Tensor, *a: Any, **kw: Any) -> Any:
            if self._depth == 0:  # .cpu() of a CPU tensor too: on a GPU it would be a read
                self.counts[name] += 1
            self._depth += 1
            try:
                return orig(t, *a, **kw)
            finally:
                self._depth -= 1

        return counted

    def __enter__(self) -> SyncCounter:
        for name in PATCHED:
            self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._wrap(name, self._saved[name]))
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)
        self._saved.clear()
