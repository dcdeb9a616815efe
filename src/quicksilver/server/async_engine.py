"""The engine in one background thread, bridged to asyncio.

The server reaches every model through this seam, and every engine is an ``engine.Engine`` (the
mock engine and the tensor-parallel one are subclasses; the AR twin is the engine over its causal
decoder), so the contract is the engine's own.

One thread steps the (synchronous) engine while it has work and sleeps on an event otherwise. Each
request gets an ``asyncio.Queue``; after every step the thread hands the step's events to the event
loop with one ``loop.call_soon_threadsafe``, so nothing on the loop ever blocks on the model. When
a consumer stops early (client disconnect, a stop string, the end of a reasoning phase) its
generator's ``finally`` calls ``engine.cancel``: the engine drops the request before its next step,
freeing its canvas and cache.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator

from ..engine import Engine, EngineEvent, EngineRequest

log = logging.getLogger("quicksilver.server")


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._queues: dict[str, asyncio.Queue[EngineEvent]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.step_errors = 0
        self.cancelled_by_client = 0

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
        while not self._stop.is_set():
            if not self.engine.has_work:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                events = self.engine.step()
            except Exception:  # the engine fails requests, not itself; this is a last resort
                self.step_errors += 1
                log.exception("engine step failed")
                continue
            if events and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._dispatch, events)
                except RuntimeError:  # the loop is closed: shutting down
                    return

    def _dispatch(self, events: list[EngineEvent]) -> None:
        for ev in events:
            q = self._queues.get(ev.request_id)
            if q is not None:
                q.put_nowait(ev)

    # ---- requests ------------------------------------------------------------------------------
    def submit(self, req: EngineRequest) -> None:
        """Queue a request (raises ConfigError / EngineOverloaded at once); then iterate ``events``."""
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

    async def events(self, request_id: str) -> AsyncGenerator[EngineEvent, None]:
        """The request's events until its final one. Leaving early cancels it in the engine."""
        q = self._queues[request_id]
        finished = False
        try:
            while True:
                ev = await q.get()
                if ev.done:
                    finished = True
                yield ev
                if ev.done:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.engine.cancel(request_id)
                self._wake.set()

    def cancel(self, request_id: str) -> None:
        self.engine.cancel(request_id)
        self._wake.set()
