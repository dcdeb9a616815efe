"""``quicksilver serve``: load the model (or the mock engine), build the app, run uvicorn (with a
graceful drain on SIGTERM/SIGINT, ``drain.py``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ..engine import Engine, EngineConfig
from ..errors import QuicksilverError
from .async_engine import AsyncEngine
from .config import ServerConfig
from .generation import Backend
from .twin import build_twin_backend


def build_backend(cfg: ServerConfig, mock_step_delay: float = 0.0) -> Backend:
    """The served model as a ``Backend`` (nothing is read from the network, ever)."""
    backend = _backend(cfg, mock_step_delay)
    if cfg.chat_template:
        path = Path(cfg.chat_template)
        if not path.is_file():
            raise QuicksilverError(f"--chat-template {path}: no such file")
        backend.tokenizer.set_chat_template(path.read_text())
    return backend


def _backend(cfg: ServerConfig, mock_step_delay: float) -> Backend:
    ecfg = EngineConfig(
        max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=cfg.prefix_cache_mb
    )
    if cfg.mock:
        from .mock_engine import MockEngine

        mock = MockEngine(config=ecfg, step_delay=mock_step_delay)
        tok = mock.tokenizer
        assert tok.mask_id is not None
        return Backend(
            cfg.served_model_name or "quicksilver-mock",
            tok,
            AsyncEngine(mock),
            mock.max_context,
            "bidirectional",
            list(tok.stop_ids),
            tok.mask_id,
        )
    import torch

    import quicksilver

    from ..cli import resolve_model

    path = resolve_model(cfg.model)
    if not (path / "config.json").is_file():
        raise QuicksilverError(f"{path}: no such checkpoint (config.json missing)")
    if cfg.verify_checksum:
        from ..models.integrity import verify_checksums

        verify_checksums(path)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.dtype not in (None, "float32", "bfloat16", "float16"):
        raise QuicksilverError(f"--dtype must be float32, bfloat16 or float16, got {cfg.dtype!r}")
    dtype = getattr(torch, cfg.dtype) if cfg.dtype else None
    pipe = quicksilver.load(
        path,
        dtype=dtype,
        device=cfg.device,
        cache=cfg.cache,
        refresh_every=cfg.refresh_every,
        compile=cfg.compile,
        backend=cfg.backend,
    )
    pipe.model.eval()
    from ..assets import embedded_model_path

    name = cfg.served_model_name or (
        "quicksilver" if path == embedded_model_path() else Path(path).name
    )
    return Backend(
        name,
        pipe.tokenizer,
        AsyncEngine(Engine(pipe.decoder, ecfg)),
        pipe.config.max_seq_len,
        pipe.config.attention,
        list(pipe.stop_ids),
        pipe.config.mask_token_id,
        dict(pipe.generation_defaults),
    )


def serve(cfg: ServerConfig, mock_step_delay: float = 0.0) -> int:
    import uvicorn

    from .app import build_app
    from .drain import DrainingServer

    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    backend = build_backend(cfg, mock_step_delay)
    twin = build_twin_backend(cfg, backend.name)
    app = build_app(backend, cfg, [twin] if twin else [])
    key = "on" if cfg.resolved_api_key() else "off"
    also = f" and its AR twin {twin.name!r}" if twin else ""
    print(
        f"quicksilver: serving {backend.name!r} ({backend.attention}, context {backend.max_context})"
        f"{also} on http://{cfg.host}:{cfg.port} (API key {key}; playground at /)",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, timeout_graceful_shutdown=5
    )
    DrainingServer(config, app.state.qs.drain, cfg.drain_timeout).run()
    return 0
