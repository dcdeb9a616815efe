"""``quicksilver serve``: load the model (or the mock engine), build the app, run uvicorn (with a
graceful drain on SIGTERM/SIGINT, ``reliability/drain.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..assets import embedded_model_path, resolve_model
from ..engine import Engine, EngineConfig
from ..errors import QuicksilverError
from ..models.integrity import verify_checksums
from ..pipeline import Pipeline, load
from .app import build_app
from .async_engine import AsyncEngine
from .config import ServerConfig
from .mock_engine import MockEngine
from .reliability.connections import protocol_with_header_timeout
from .reliability.drain import DrainingServer
from .serving.generation import ServedModel


def build_served_model(cfg: ServerConfig, mock_step_delay: float = 0.0) -> ServedModel:
    """The model to serve (nothing is read from the network, ever)."""
    served = _served(cfg, mock_step_delay)
    if cfg.chat_template:
        path = Path(cfg.chat_template)
        if not path.is_file():
            raise QuicksilverError(f"--chat-template {path}: no such file")
        served.tokenizer.set_chat_template(path.read_text())
    return served


def engine_config(cfg: ServerConfig) -> EngineConfig:
    return EngineConfig(
        max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=cfg.prefix_cache_mb
    )


def _served(cfg: ServerConfig, mock_step_delay: float) -> ServedModel:
    ecfg = engine_config(cfg)
    if cfg.mock:
        mock = MockEngine(config=ecfg, step_delay=mock_step_delay)
        tok = mock.tokenizer
        assert tok.mask_id is not None
        return ServedModel(
            cfg.served_model_name or "quicksilver-mock",
            tok,
            AsyncEngine(mock),
            mock.max_context,
            "bidirectional",
            list(tok.stop_ids),
            tok.mask_id,
        )
    pipe = load_pipeline(cfg)
    return served_pipeline(cfg, pipe, Engine(pipe.decoder, ecfg))


def load_pipeline(cfg: ServerConfig, device: str | None = None) -> Pipeline:
    """The checkpoint ``cfg`` names, loaded as its ``LoadConfig`` fields say, on ``device``
    (default: ``cfg.device``)."""
    path = resolve_model(cfg.model)
    if not (path / "config.json").is_file():
        raise QuicksilverError(f"{path}: no such checkpoint (config.json missing)")
    if cfg.verify_checksum:
        verify_checksums(path)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    pipe = load(path, cfg, device=device or cfg.device)
    pipe.model.eval()
    return pipe


def served_pipeline(cfg: ServerConfig, pipe: Pipeline, engine: Engine) -> ServedModel:
    """The served model: ``pipe`` stepped by ``engine`` (on the engine thread)."""

    path = resolve_model(cfg.model)
    name = cfg.served_model_name or (
        "quicksilver" if path == embedded_model_path() else Path(path).name
    )
    return ServedModel(
        name,
        pipe.tokenizer,
        AsyncEngine(engine),
        pipe.config.max_seq_len,
        pipe.config.attention,
        list(pipe.stop_ids),
        pipe.config.mask_token_id,
        dict(pipe.generation_defaults),
        pipe.runtime,
    )


def run_server(
    cfg: ServerConfig, served: ServedModel, twins: list[ServedModel], note: str = ""
) -> int:
    """Serve ``served`` (and ``twins``) over HTTP until SIGTERM/SIGINT, then drain."""
    import uvicorn

    app = build_app(served, cfg, twins)
    key = "on" if cfg.resolved_api_key() else "off"
    also = "".join(f" and its AR twin {t.name!r}" for t in twins)
    print(
        f"quicksilver: serving {served.name!r} ({served.attention}, context {served.max_context},"
        f" steps on {served.runtime})"
        f"{also}{note} on http://{cfg.host}:{cfg.port} (API key {key}; playground at /)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        timeout_graceful_shutdown=5,
        http=protocol_with_header_timeout(cfg.header_timeout),
    )
    DrainingServer(config, app.state.qs.drain, cfg.drain_timeout).run()
    return 0
