"""The served models: each checkpoint (or the mock engine) with its engine on a thread of this
process or, with ``--engine process``, in a process of its own, and the facts the server needs.

The engine factories here (``model_engine``, ``mock_engine``; the twin's in ``twin.py``) are
module-level and take only the picklable ``ServerConfig``, so the same call builds the engine
in this process or in the engine's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..assets import embedded_model_path, resolve_model
from ..engine import Engine, EngineConfig
from ..errors import ConfigError, QuicksilverError
from ..hub import parse_hub_id
from ..models.checkpoint import load_tokenizer
from ..models.integrity import verify_checksums
from ..pipeline import Pipeline, load
from ..tokenizer import Tokenizer
from .async_engine import AsyncEngine, EngineClient
from .config import SERVER_CHOICES, ServerConfig
from .engine_process import Factory, ProcessEngine
from .mock_engine import MockEngine
from .serving.generation import ServedModel


def build_served_model(cfg: ServerConfig, mock_step_delay: float = 0.0) -> ServedModel:
    """The model to serve (the network only to fetch a Hub id the cache lacks), its engine on a
    thread or, with ``--engine process``, in a process of its own."""
    if cfg.mock:
        client, facts = engine_client(cfg, partial(mock_engine, cfg, mock_step_delay))
        tok = Tokenizer.byte_level()  # the mock engine's own
        name = cfg.served_model_name or "quicksilver-mock"
    else:
        path = resolve_model(cfg.model, revision=cfg.revision)
        if not (path / "config.json").is_file():
            raise QuicksilverError(f"{path}: no such checkpoint (config.json missing)")
        client, facts = engine_client(cfg, partial(model_engine, cfg))
        tok, name = load_tokenizer(path), served_name(cfg)
    if cfg.chat_template:
        template = Path(cfg.chat_template)
        if not template.is_file():
            raise QuicksilverError(f"--chat-template {template}: no such file")
        tok.set_chat_template(template.read_text())
    return ServedModel(name, tok, client, **facts)


def served_name(cfg: ServerConfig) -> str:
    """The id clients send as ``model``: ``--served-model-name``, else quicksilver for the embedded
    model, else the Hub id (``org/name``, no revision) or the checkpoint directory's name."""
    path = resolve_model(cfg.model, revision=cfg.revision)
    if cfg.served_model_name:
        return cfg.served_model_name
    if path == embedded_model_path():
        return "quicksilver"
    if cfg.model is not None and not Path(cfg.model).exists():
        repo_id, _ = parse_hub_id(cfg.model, cfg.revision)
        return repo_id or path.name
    return path.name


def served_pipeline(cfg: ServerConfig, pipe: Pipeline, engine: Engine) -> ServedModel:
    """``pipe`` stepped by ``engine`` on this process's engine thread (tensor parallel rank 0)."""
    return ServedModel(
        served_name(cfg), pipe.tokenizer, AsyncEngine(engine), **pipeline_facts(pipe)
    )


def engine_client(cfg: ServerConfig, factory: Factory) -> tuple[EngineClient, dict[str, Any]]:
    """``factory``'s engine on this process's engine thread, or in its own process (``cfg.engine``),
    and the facts it reported about its model."""
    if cfg.engine not in SERVER_CHOICES["engine"]:
        raise ConfigError(f"engine must be one of {SERVER_CHOICES['engine']}, got {cfg.engine!r}")
    if cfg.engine == "process":
        proc = ProcessEngine(factory)
        return proc, proc.facts
    engine, facts = factory()
    return AsyncEngine(engine), facts


def engine_config(cfg: ServerConfig) -> EngineConfig:
    return EngineConfig(
        max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=cfg.prefix_cache_mb
    )


def mock_engine(cfg: ServerConfig, step_delay: float) -> tuple[Engine, dict[str, Any]]:
    mock = MockEngine(config=engine_config(cfg), step_delay=step_delay)
    tok = mock.tokenizer
    assert tok.mask_id is not None
    facts = {
        "max_context": mock.max_context,
        "attention": "bidirectional",
        "stop_ids": list(tok.stop_ids),
        "mask_id": tok.mask_id,
    }
    return mock, facts


def model_engine(cfg: ServerConfig) -> tuple[Engine, dict[str, Any]]:
    """The checkpoint ``cfg`` names, stepped by an engine, and the facts the server needs of it."""
    pipe = load_pipeline(cfg)
    return Engine(pipe.decoder, engine_config(cfg)), pipeline_facts(pipe)


def pipeline_facts(pipe: Pipeline) -> dict[str, Any]:
    """``ServedModel``'s fields that come from the loaded model."""
    return {
        "max_context": pipe.max_context,
        "attention": pipe.attention,
        "stop_ids": list(pipe.stop_ids),
        "mask_id": pipe.mask_id,
        "defaults": dict(pipe.generation_defaults),
        "runtime": pipe.runtime_name,
    }


def load_pipeline(cfg: ServerConfig, device: str | None = None) -> Pipeline:
    """The checkpoint ``cfg`` names, loaded as its ``LoadConfig`` fields say, on ``device``
    (default: ``cfg.device``)."""
    path = resolve_model(cfg.model, revision=cfg.revision)
    if not (path / "config.json").is_file():
        raise QuicksilverError(f"{path}: no such checkpoint (config.json missing)")
    if cfg.verify_checksum:
        verify_checksums(path)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    pipe = load(path, cfg, device=device or cfg.device)
    pipe.network.eval()
    if cfg.warmup:
        pipe.warm_up()
    return pipe
