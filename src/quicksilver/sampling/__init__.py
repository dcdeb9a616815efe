"""Parallel refinement: what to commit, what to revise, when to stop."""

from .config import SamplerConfig
from .decoder import Decoder, DecodeResult, Row, RowEvent
from .noise import sample_tokens
from .policies import POLICIES, Policy
from .reference import reference_generate

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
