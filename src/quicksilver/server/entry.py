"""``quicksilver serve``: one process (``launch.py``), tensor-parallel ranks (``scale/tp_launch.py``) or
Ray Serve replicas (``scale/ray_serve.py``), as the config asks."""

from __future__ import annotations

import logging

from .config import ServerConfig
from .launch import run_server
from .scale.tp_launch import serve_tensor_parallel
from .served import build_served_model
from .twin import build_companions


def serve(cfg: ServerConfig, mock_step_delay: float = 0.0) -> int:
    if cfg.replicas or cfg.max_replicas or cfg.ray_address:
        from .scale.ray_serve import serve_ray  # lazy: Ray is an optional dependency

        return serve_ray(cfg)
    if cfg.tensor_parallel > 1:
        return serve_tensor_parallel(cfg)
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    served = build_served_model(cfg, mock_step_delay)
    return run_server(cfg, served, build_companions(cfg, served.name))
