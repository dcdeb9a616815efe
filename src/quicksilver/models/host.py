"""Small tensors of host values that a step builds on every pass (counts, thresholds, row indices).

On a GPU, ``torch.tensor(values, device="cuda")`` copies from pageable memory, which waits for the
stream to drain; ``to_device`` stages the values in pinned memory and copies them with
``non_blocking=True`` (the caching host allocator keeps the staging buffer alive until the copy has
run), so the host can prepare the next step while the GPU works. On the CPU it is ``torch.tensor``.
``bench/syncs.py`` counts these uploads and the ones that still block.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(values: Sequence[object], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype, device=device)`` without a blocking host-to-device copy."""
    if device.type == "cpu" and dtype == torch.long:
        return torch.from_numpy(np.array(values, dtype=np.int64))  # a third of torch.tensor's time
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)
