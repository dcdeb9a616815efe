"""``quicksilver serve --replicas N``: the same app on Ray Serve, N replicas behind one endpoint.

Two deployments (``docs/SCALING.md``):

- ``Ingress`` (one, no CPU reserved) takes every HTTP request from Ray Serve's proxy, reads its
  body, computes the routing key (``routing.route_key``) and forwards the request through a
  deployment handle, streaming the reply back as it comes. Its handle routes with the custom
  request router (``ray_router.py``): to the replica holding the prompt's prefix, else the least
  loaded one.
- ``Replica`` (N of them, or autoscaled) owns one engine and runs the whole single-process app
  (``app.build_app``: API key, limits, timeouts, drain, /health, /metrics, streaming) on the
  forwarded ASGI request. When the client goes away Ray cancels the forwarded call, the replica
  tells the app ``http.disconnect``, and the app cancels the engine request as it does on one
  process. Each reply carries ``x-quicksilver-replica``; ``/health`` and ``/metrics`` answer for
  the replica that got them (Ray's own metrics and dashboard cover the cluster).

On shutdown (SIGTERM/SIGINT) Ray Serve stops sending requests to the replicas and waits up to
``drain_timeout`` seconds for the ones in flight (``graceful_shutdown_timeout_s``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message

from ...errors import QuicksilverError
from ..app import build_app
from ..config import ServerConfig
from ..protocol.errors import error_body
from ..reliability.lifecycle import replay
from ..served import build_served_model
from ..twin import build_companions
from .ray_router import ROUTERS
from .routing import route_key

log = logging.getLogger("quicksilver.server")
APP_NAME = "quicksilver"
SCOPE_KEYS = (
    *("type", "http_version", "method", "scheme", "path", "raw_path", "query_string"),
    *("root_path", "headers", "server", "client"),
)


def portable_scope(scope: dict[str, Any]) -> dict[str, Any]:
    """The parts of an ASGI HTTP scope that travel to another process (no app, router or state)."""
    out = {k: scope[k] for k in SCOPE_KEYS if k in scope}
    out["root_path"] = ""
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    out["asgi"] = {"version": "3.0"}
    return out


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read up to one byte past ``limit`` (the replica's app answers 413 for that)."""
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            break
    return bytes(buf)


class Replica:
    """One engine and the single-process app, serving requests forwarded by the ingress."""

    def __init__(self, cfg: ServerConfig) -> None:
        import torch

        torch.set_num_threads(max(1, cfg.threads))
        served = build_served_model(cfg)
        self.app = build_app(served, cfg, build_companions(cfg, served.name))
        self.state = self.app.state.qs
        self.tag = serve.get_replica_context().replica_id.unique_id

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine died with work left is replaced (the
        rule of ``/health``'s ``engine stopped``)."""
        for b in self.state.served_models:
            if not b.engine.alive and b.engine.engine.has_work:
                raise RuntimeError(f"the engine of {b.name!r} died")

    async def handle(
        self, scope: dict[str, Any], body: bytes, route_key: list[str] | None = None
    ) -> AsyncIterator[Message]:
        """Run the app on one request; yield its ASGI messages (start, then body chunks)."""
        gone = asyncio.Event()
        out: asyncio.Queue[Message | None] = asyncio.Queue()

        async def until_gone() -> Message:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                tag = (b"x-quicksilver-replica", self.tag.encode())
                msg = {**msg, "headers": [*msg.get("headers", []), tag]}
            await out.put(msg)

        receive = replay(body, until_gone)
        task = asyncio.create_task(self.app({**scope, "state": {}}, receive, send))
        task.add_done_callback(lambda _: out.put_nowait(None))
        try:
            while (msg := await out.get()) is not None:
                yield msg
                if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                    break
        finally:
            gone.set()  # the client left (Ray cancelled this call) or the reply is complete
            await asyncio.wait({task}, timeout=10)

    async def __del__(self) -> None:
        """Ray Serve's shutdown hook, after its graceful wait: refuse new work, stop the engines."""
        self.state.drain.begin()
        for b in self.state.served_models:
            await b.engine.stop()


class Ingress:
    """Every HTTP request: read the body, key it by its prompt prefix, forward, stream back."""

    def __init__(self, replicas: Any, max_body_bytes: int, body_timeout: float) -> None:
        self.replicas = replicas.options(stream=True)
        self.max_body_bytes, self.body_timeout = max_body_bytes, body_timeout

    async def __call__(self, request: Request) -> Response:
        try:
            body = await asyncio.wait_for(
                read_body(request, self.max_body_bytes), self.body_timeout
            )
        except (TimeoutError, ClientDisconnect):
            msg = f"the request body did not arrive within {self.body_timeout:g} s"
            return JSONResponse(error_body(msg, "invalid_request_error", None, "timeout"), 408)
        gen = self.replicas.handle.remote(
            portable_scope(dict(request.scope)), body, route_key=route_key(request.url.path, body)
        )
        try:
            start = await gen.__anext__()
        except Exception as e:  # noqa: BLE001 - a replica that died or refused: an envelope, 503
            log.warning("replica call failed: %s: %s", type(e).__name__, e)
            msg = f"no replica could serve the request ({type(e).__name__}); try again shortly"
            return JSONResponse(error_body(msg, "server_error", None, "unavailable"), 503)
        resp = StreamingResponse(_bodies(gen), status_code=int(start["status"]))
        resp.raw_headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
        return resp


async def _bodies(gen: Any) -> AsyncIterator[bytes]:
    """The body chunks of a forwarded reply; leaving early (client gone) cancels the replica call."""
    try:
        async for msg in gen:
            if msg["type"] == "http.response.body" and msg.get("body"):
                yield msg["body"]
    finally:
        gen.cancel()


def _scaling(cfg: ServerConfig) -> dict[str, Any]:
    """``num_replicas`` or, with ``--max-replicas``, Ray Serve's autoscaling config."""
    if cfg.max_replicas:
        if not 0 <= cfg.min_replicas <= cfg.max_replicas:
            raise QuicksilverError("--min-replicas must be between 0 and --max-replicas")
        return {
            "autoscaling_config": {
                "min_replicas": cfg.min_replicas,
                "initial_replicas": max(cfg.min_replicas, min(cfg.replicas, cfg.max_replicas)),
                "max_replicas": cfg.max_replicas,
                "target_ongoing_requests": cfg.target_ongoing_requests,
            }
        }
    return {"num_replicas": max(1, cfg.replicas)}


def replica_resources(cfg: ServerConfig) -> dict[str, float]:
    """Ray resources of one replica: a GPU, or its CPU threads."""
    if (cfg.device or "").startswith("cuda"):
        return {"num_cpus": 1, "num_gpus": 1}
    return {"num_cpus": max(1, cfg.threads)}


def build_ray_app(cfg: ServerConfig) -> Any:
    """The Ray Serve application: the ingress bound to the replicas."""
    if cfg.tensor_parallel > 1:
        raise QuicksilverError(
            "--tensor-parallel runs one server over several ranks; it does not combine with "
            "--replicas yet (docs/SCALING.md)"
        )
    if cfg.routing not in ROUTERS:
        raise QuicksilverError(f"--routing must be one of {sorted(ROUTERS)}, got {cfg.routing!r}")
    router = RequestRouterConfig(request_router_class=ROUTERS[cfg.routing])  # type: ignore[arg-type]
    replica = serve.deployment(
        name="Replica",
        ray_actor_options=replica_resources(cfg),
        max_ongoing_requests=cfg.max_concurrent,
        graceful_shutdown_timeout_s=cfg.drain_timeout,
        request_router_config=router,
        **_scaling(cfg),
    )(Replica)
    ingress = serve.deployment(name="Ingress", num_replicas=1, ray_actor_options={"num_cpus": 0})(
        Ingress
    )
    return ingress.bind(replica.bind(cfg), cfg.max_body_bytes, cfg.body_timeout)


def start(cfg: ServerConfig) -> None:
    """Join (``--ray-address``) or start a Ray instance and run the app on it; returns when up."""
    import ray

    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    ray.init(
        address=cfg.ray_address or None,
        include_dashboard=False,
        logging_level=getattr(logging, cfg.log_level.upper(), logging.WARNING),
        log_to_driver=cfg.log_level == "debug",
    )
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(build_ray_app(cfg), name=APP_NAME, route_prefix="/")


def stop() -> None:
    """Shut the app down (replicas drain their requests first) and leave Ray."""
    import ray

    serve.shutdown()
    ray.shutdown()


def serve_ray(cfg: ServerConfig) -> int:
    """The blocking ``serve --replicas`` entry point: run until SIGTERM/SIGINT, then drain."""
    start(cfg)
    print(
        f"quicksilver: {max(1, cfg.replicas)} replica(s) on Ray Serve "
        f"({cfg.routing} routing) at http://{cfg.host}:{cfg.port}",
        file=sys.stderr,
        flush=True,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    print("quicksilver: draining the replicas", file=sys.stderr, flush=True)
    stop()
    return 0
