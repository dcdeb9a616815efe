"""The OpenAI-compatible server: ``build_app(served, config)``, ``ServerConfig``, the mock engine."""

from .app import build_app
from .config import ServerConfig
from .entry import serve
from .mock_engine import MockEngine
from .served import build_served_model

__all__ = ["build_app", "build_served_model", "serve", "ServerConfig", "MockEngine"]
