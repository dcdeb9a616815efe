"""``quicksilver serve``: build the app over the served models (``served.py``) and run uvicorn (with
a graceful drain on SIGTERM/SIGINT, ``reliability/drain.py``)."""

from __future__ import annotations

import sys

from .app import build_app
from .config import ServerConfig
from .reliability.connections import protocol_with_header_timeout
from .reliability.drain import DrainingServer
from .serving.generation import ServedModel

SWITCH_INTERVAL = 0.0005  # seconds a thread may hold the GIL while another waits for it


def run_server(
    cfg: ServerConfig, served: ServedModel, twins: list[ServedModel], note: str = ""
) -> int:
    """Serve ``served`` (and ``twins``) over HTTP until SIGTERM/SIGINT, then drain."""
    import uvicorn

    # the engine threads wait for the GIL after every pass while the event loop (or another
    # engine) holds it: at Python's default 5 ms switch interval a busy loop thread made a 3.3 ms
    # pass take 19.7; at 0.5 ms, 5.7 (docs/LOG.md, 2026-12-04)
    sys.setswitchinterval(SWITCH_INTERVAL)
    app = build_app(served, cfg, twins)
    key = "on" if cfg.resolved_api_key() else "off"
    also = "".join(f" and {t.name!r}" for t in twins)
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
    server = DrainingServer(config, app.state.qs.drain, cfg.drain_timeout)
    server.run()
    return 130 if server.interrupted else 0  # the CLI's status for an interrupt, as on Ctrl-C
