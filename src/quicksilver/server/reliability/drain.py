"""Graceful shutdown: on SIGTERM/SIGINT stop admitting, let in-flight requests finish, end the rest.

uvicorn's own shutdown closes the listening socket at once (new clients get "connection refused")
and cuts whatever is still streaming when its grace period ends. ``DrainingServer`` puts a drain
in front of it. The first signal sets ``Drain.draining``: new generating requests get 503 +
``Retry-After`` and ``/health`` answers 503 ``draining`` (so a load balancer stops routing here),
while open requests run on for up to ``drain_timeout`` seconds. Those still open then are
cancelled; the request middleware ends each with an error event and ``data: [DONE]`` (or a 503
envelope). Only then does uvicorn's shutdown start. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from types import FrameType

import anyio
import uvicorn

from ..protocol.errors import APIError

log = logging.getLogger("quicksilver.server")


@dataclass(eq=False)  # hashed by identity: two requests may share a client-sent request id
class InFlight:
    """What a drain needs to know of one open request."""

    scope: anyio.CancelScope
    ended_by: str | None = None  # "shutdown" when a drain cancelled it


@dataclass
class Drain:
    """Shutdown state shared by the request middleware, /health and the server loop."""

    draining: bool = False
    inflight: set[InFlight] = field(default_factory=set)

    def begin(self) -> None:
        self.draining = True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is open (True) or ``timeout`` seconds pass (False)."""
        with anyio.move_on_after(timeout):
            while self.inflight:
                await anyio.sleep(0.05)
        return not self.inflight

    def cancel_all(self) -> int:
        """End every open request now (each gets its error ending from the middleware)."""
        for f in list(self.inflight):
            f.ended_by = "shutdown"
            f.scope.cancel()
        return len(self.inflight)


def draining_error() -> APIError:
    return APIError(
        503,
        "the server is shutting down; retry on another replica or shortly",
        "server_error",
        None,
        "server_shutting_down",
        {"Retry-After": "5"},
    )


class DrainingServer(uvicorn.Server):
    """uvicorn's server with a drain before its shutdown."""

    def __init__(self, config: uvicorn.Config, drain: Drain, drain_timeout: float) -> None:
        super().__init__(config)
        self.drain, self.drain_timeout = drain, drain_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None

    async def serve(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @property
    def interrupted(self) -> bool:
        """Whether a SIGINT stopped it. uvicorn re-raises the signal after the shutdown, which a
        process whose parent ignored SIGINT (a shell's background job) ignores too."""
        return signal.SIGINT in self._captured_signals

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or self._loop is None:  # a second signal: shut down now
            self.drain.cancel_all()
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)
        self.drain.begin()
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._task = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        open_now = len(self.drain.inflight)
        log.warning("draining: %d requests open, up to %g s", open_now, self.drain_timeout)
        if not await self.drain.wait_idle(self.drain_timeout):
            log.warning("drain timeout: ending %d requests", self.drain.cancel_all())
            await self.drain.wait_idle(5.0)
        self.should_exit = True
