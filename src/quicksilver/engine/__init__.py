"""Requests, continuous batching, streaming events (synchronous; the server wraps it in asyncio)."""

from .detok import IncrementalDetokenizer
from .engine import Engine, EngineConfig, EngineEvent, EngineOverloaded, EngineRequest, RequestStats

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineEvent",
    "EngineOverloaded",
    "EngineRequest",
    "RequestStats",
    "IncrementalDetokenizer",
]
