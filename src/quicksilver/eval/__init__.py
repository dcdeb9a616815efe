"""Evaluation of models on the task suite (accuracy by verifier, NFE, TPF, tok/s) and sweeps."""

from .evaluate import decode_items, evaluate

__all__ = ["evaluate", "decode_items"]
