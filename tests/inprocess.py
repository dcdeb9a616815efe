"""A real HTTP server in this process: uvicorn on a free loopback port in a thread, serving an app
built here (the mock engine, or any served), stopped at the end. Faster than a subprocess, and the
clients under test still speak real HTTP to it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from quicksilver.server import ServerConfig, build_app, build_served_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(cfg: ServerConfig | None = None, served: object = None) -> Iterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT``) of a running server."""
    cfg = cfg or ServerConfig(mock=True)
    app = build_app(served or build_served_model(cfg), cfg)  # type: ignore[arg-type]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
