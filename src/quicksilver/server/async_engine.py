"""The engine in one background thread, bridged to asyncio (the default; ``engine_process.py`` runs
it in its own process behind the same ``EngineClient`` surface).

The server reaches every model through this seam, and every engine is an ``engine.Engine`` (the
mock engine and the tensor-parallel one are subclasses; the AR twin is the engine over its causal
decoder), so the contract is the engine's own.

One thread (``drive``, the step loop both designs run) steps the (synchronous) engine while it
has work and sleeps on an event otherwise. Each request gets an ``asyncio.Queue``; after every step
the thread hands the step's events to the event loop with one ``loop.call_soon_threadsafe``, so
nothing on the loop ever blocks on the model. When a consumer stops early (client disconnect, a
stop string, the end of a reasoning phase), leaving ``until_done`` calls ``engine.cancel``: the
engine drops the request before its next step, freeing its canvas and cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from ..engine import Engine, EngineEvent, EngineRequest

log = logging.getLogger("quicksilver.server")


class PrefixCounts(Protocol):
    """What ``/metrics`` reads of a prefix cache: prompt tokens looked up, and served from it."""

    @property
    def query_tokens(self) -> int: ...
    @property
    def hit_tokens(self) -> int: ...


class EngineView(Protocol):
    """What the server reads of an engine: admission, ``/metrics`` and ``/health``."""

    @property
    def num_running(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def has_work(self) -> bool: ...
    @property
    def failing_steps(self) -> int: ...
    @property
    def totals(self) -> Counter[str]: ...
    @property
    def prefix_cache(self) -> PrefixCounts | None: ...


class EngineClient(Protocol):
    """The server's handle on one engine: ``AsyncEngine`` (a thread) or ``ProcessEngine``."""

    @property
    def engine(self) -> EngineView: ...
    @property
    def alive(self) -> bool: ...
    def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def submit(self, req: EngineRequest) -> None: ...
    def events(self, request_id: str) -> AsyncGenerator[EngineEvent, None]: ...
    def cancel(self, request_id: str) -> None: ...


def drive(
    engine: Engine,
    stop: threading.Event,
    wake: threading.Event,
    emit: Callable[[list[EngineEvent]], bool],
    idle: Callable[[], object] | None = None,
) -> None:
    """Step ``engine`` while it has work and sleep on ``wake`` otherwise, until ``stop``; hand each
    step's events to ``emit`` (False: stop). ``idle`` is called each time the work runs out."""
    busy = False
    while not stop.is_set():
        if not engine.has_work:
            if busy and idle is not None:
                idle()
            busy = False
            wake.wait(0.05)
            wake.clear()
            continue
        busy = True
        try:
            events = engine.step()
        except Exception:  # the engine fails requests, not itself; this is a last resort
            engine.totals["step_errors"] += 1
            log.exception("engine step failed")
            continue
        if events and not emit(events):
            return


async def until_done(
    q: asyncio.Queue[EngineEvent], leave: Callable[[bool], None]
) -> AsyncGenerator[EngineEvent, None]:
    """``q``'s events up to a request's final one; ``leave(finished)`` runs however the consumer
    leaves (``finished`` False: it stopped early, so the request is to be cancelled)."""
    finished = False
    try:
        while True:
            ev = await q.get()
            finished = finished or ev.done
            yield ev
            if ev.done:
                return
    finally:
        leave(finished)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[EngineEvent]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="quicksilver-engine", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10.0)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        drive(self.engine, self._stop, self._wake, self._hand_over)

    def _hand_over(self, events: list[EngineEvent]) -> bool:
        if self._loop is None:
            return True
        try:
            self._loop.call_soon_threadsafe(self._dispatch, events)
        except RuntimeError:  # the loop is closed: shutting down
            return False
        return True

    def _dispatch(self, events: list[EngineEvent]) -> None:
        for ev in events:
            q = self._queues.get(ev.request_id)
            if q is not None:
                q.put_nowait(ev)

    # ---- requests ------------------------------------------------------------------------------
    async def submit(self, req: EngineRequest) -> None:
        """Queue a request (raises ConfigError / EngineOverloaded); then iterate ``events``."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or not self.alive:  # first request, or a new loop (tests)
            if self.alive:
                self._loop = loop
            else:
                self.start()
        self._queues[req.request_id] = asyncio.Queue()
        try:
            self.engine.add(req)
        except Exception:
            self._queues.pop(req.request_id, None)
            raise
        self._wake.set()

    def events(self, request_id: str) -> AsyncGenerator[EngineEvent, None]:
        """The request's events until its final one. Leaving early cancels it in the engine."""
        return until_done(self._queues[request_id], lambda done: self._leave(request_id, done))

    def _leave(self, request_id: str, finished: bool) -> None:
        self._queues.pop(request_id, None)
        if not finished:
            self.engine.cancel(request_id)
            self._wake.set()

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()
