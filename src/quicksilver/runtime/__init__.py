"""The runtime layer: how a network runs fast on one machine (caches and pools, packed passes,
step backends, quantized weights, the pass planner). See runtime/runtime.py."""

from .runtime import Runtime, as_runtime
from .segment import Segment

__all__ = ["Runtime", "Segment", "as_runtime"]
