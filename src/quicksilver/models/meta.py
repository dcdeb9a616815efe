"""``meta_build()``: a context in which networks are built on the meta device without running their
initialisers, for loads that set every tensor themselves (a checkpoint's, quantized or not).

On the meta device an initialiser computes nothing, yet each call still dispatches through torch's
device mode: LLaDA2-mini's 20 layers of 257 experts took over a minute per construction. Inside
the context ``torch.nn.init``'s in-place initialisers return their tensor untouched (what
transformers' ``no_init_weights`` does); outside it nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_", "trunc_normal_", "zeros_", "ones_")


def _untouched(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


@contextmanager
def meta_build() -> Iterator[None]:
    """Build on the meta device with ``torch.nn.init``'s initialisers switched off."""
    saved = {name: getattr(nn.init, name) for name in INITIALISERS}
    try:
        for name in INITIALISERS:
            setattr(nn.init, name, _untouched)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)
