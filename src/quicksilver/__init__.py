"""quicksilver: a reasoning diffusion LLM engine and OpenAI-compatible server."""

from .errors import CheckpointError, ConfigError, QuicksilverError
from .pipeline import GenerationResult, LoadConfig, Pipeline, load

__version__ = "0.1.0"
__all__ = [
    "load",
    "LoadConfig",
    "Pipeline",
    "GenerationResult",
    "QuicksilverError",
    "CheckpointError",
    "ConfigError",
    "__version__",
]
