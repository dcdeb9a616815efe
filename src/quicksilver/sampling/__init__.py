"""Parallel refinement: what to commit, what to revise, when to stop.

Three subpackages: ``core/`` (the shared primitives: config, policies, sampling, selection, hooks,
row state, cache modes), ``decoders/`` (one algorithm a file, and ``decoder_for``, the factory
that picks one) and ``structured/`` (the structured-output compiler behind constrained rows). This
module re-exports the names the layers above use most.
"""

from .core.config import SamplerConfig
from .core.noise import sample_tokens
from .core.policies import POLICIES, Policy
from .core.state import DecodeResult, Row, RowEvent
from .decoders.diffusion import Decoder
from .decoders.reference import reference_generate

__all__ = [
    "SamplerConfig",
    "Decoder",
    "DecodeResult",
    "Row",
    "RowEvent",
    "POLICIES",
    "Policy",
    "sample_tokens",
    "reference_generate",
]
