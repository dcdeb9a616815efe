"""The engine in its own process (``serve --engine process``), as vLLM's V1 engine core runs apart
from its API server: the HTTP loop never shares an interpreter with a decode step.

``ProcessEngine`` has ``AsyncEngine``'s surface (start, stop, alive, submit, events, cancel, and
``engine``: what the server reads of an engine, here a mirror the child keeps current). The child
builds its engine from a picklable factory, which also reports the loaded model's facts, and runs
``async_engine.drive``. One duplex pipe carries every message, pickled by hand (``send_bytes``) so
that tensors are copied, not passed as shared-memory handles:

- parent -> child: ``("add", EngineRequest)``, ``("cancel", request_id)``, ``("stop",)``
- child -> parent: ``("ready", facts)`` | ``("failed", message)`` once; then ``("ack", request_id,
  exception or None)`` per add, and ``("events", events, updates, numbers)`` per step, where
  ``updates`` is what each request's recording constraint took since the last step (``take`` in the
  child, ``put`` into the parent's copy: the log-probabilities) and ``numbers`` the engine's
  gauges and totals.

A child that dies fails every open request with an error event; ``/health`` then says the engine
stopped. Written here rather than on ``multiprocessing.Queue``: a queue's feeder thread would pickle
on the event loop's interpreter anyway, and acks must be matched to the awaiting ``submit``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import pickle
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ..engine import Engine, EngineEvent, EngineRequest
from ..engine.engine import RequestStats
from ..errors import QuicksilverError
from .async_engine import drive, until_done
from .protocol.errors import APIError

log = logging.getLogger("quicksilver.server")

LOST = "the engine process exited"
READY_TIMEOUT = 600.0  # seconds the child may take to load its model
Factory = Callable[[], tuple[Engine, dict[str, Any]]]


@dataclass
class PrefixNumbers:
    query_tokens: int = 0
    hit_tokens: int = 0


@dataclass
class Numbers:
    """What the server reads of an engine: admission, ``/metrics`` and ``/health``."""

    num_running: int = 0
    num_waiting: int = 0
    has_work: bool = False
    failing_steps: int = 0
    totals: Counter[str] = field(default_factory=Counter)
    prefix_cache: PrefixNumbers | None = None


def numbers(engine: Engine) -> Numbers:
    pc = engine.prefix_cache
    return Numbers(
        engine.num_running,
        engine.num_waiting,
        engine.has_work,
        engine.failing_steps,
        Counter(engine.totals),
        None if pc is None else PrefixNumbers(pc.query_tokens, pc.hit_tokens),
    )


class _Pipe:
    """One end of the duplex pipe: whole pickled messages, sends serialised by a lock."""

    def __init__(self, conn: Connection) -> None:
        self.conn, self._lock = conn, threading.Lock()

    def send(self, *msg: Any) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            self.conn.send_bytes(data)

    def recv(self) -> tuple[Any, ...]:
        return pickle.loads(self.conn.recv_bytes())  # type: ignore[no-any-return]


# ---- the child ---------------------------------------------------------------------------------
def child_main(factory: Factory, conn: Connection) -> None:
    # a terminal's Ctrl-C reaches the whole process group: the server drains first, then stops this
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    pipe = _Pipe(conn)
    try:
        engine, facts = factory()
    except Exception as e:  # noqa: BLE001 - reported to the parent, which refuses to start
        pipe.send("failed", f"{type(e).__name__}: {e}")
        return
    gc.collect()
    gc.freeze()  # the model and imports live as long as the process (see app.py)
    stop, wake = threading.Event(), threading.Event()
    constraints: dict[str, Any] = {}  # request id -> its recording constraint

    def read() -> None:
        while not stop.is_set():
            try:
                kind, *args = pipe.recv()
            except (EOFError, OSError):  # the parent went away
                break
            if kind == "add":
                req: EngineRequest = args[0]
                try:
                    engine.add(req)
                except Exception as e:  # noqa: BLE001 - raised again by the awaiting submit
                    pipe.send("ack", req.request_id, e)
                    continue
                if hasattr(req.constraint, "take"):
                    constraints[req.request_id] = req.constraint
                pipe.send("ack", req.request_id, None)
            elif kind == "cancel":
                engine.cancel(args[0])
            else:
                break
            wake.set()
        stop.set()
        wake.set()

    def emit(events: list[EngineEvent]) -> bool:
        updates = {}
        for ev in events:
            c = constraints.pop(ev.request_id, None) if ev.done else constraints.get(ev.request_id)
            if c is not None:
                updates[ev.request_id] = c.take()
        try:
            pipe.send("events", events, updates, numbers(engine))
        except OSError:
            return False
        return True

    pipe.send("ready", facts)
    threading.Thread(target=read, name="quicksilver-engine-reader", daemon=True).start()
    drive(engine, stop, wake, emit, idle=lambda: emit([]))


# ---- the parent --------------------------------------------------------------------------------
class ProcessEngine:
    """The engine in a child process, bridged to asyncio (``AsyncEngine``'s surface)."""

    def __init__(self, factory: Factory) -> None:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        mine, theirs = ctx.Pipe(duplex=True)
        self._pipe = _Pipe(mine)
        self._proc = ctx.Process(
            target=child_main, args=(factory, theirs), name="quicksilver-engine", daemon=True
        )
        self._proc.start()
        theirs.close()
        if not mine.poll(READY_TIMEOUT):
            self._proc.kill()
            raise QuicksilverError("the engine process did not start in time")
        try:
            kind, payload = self._pipe.recv()
        except EOFError:
            raise QuicksilverError("the engine process exited while loading") from None
        if kind != "ready":
            raise QuicksilverError(f"the engine process could not load the model: {payload}")
        self.facts: dict[str, Any] = payload
        self.engine = Numbers()  # kept current from every events message
        self._queues: dict[str, asyncio.Queue[EngineEvent]] = {}
        self._acks: dict[str, asyncio.Future[BaseException | None]] = {}
        self._recorders: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lost = False

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._pipe.conn.fileno())
        self._loop = loop
        loop.add_reader(self._pipe.conn.fileno(), self._readable)

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._pipe.conn.fileno())
            self._loop = None
        if self._proc.is_alive():
            try:
                self._pipe.send("stop")
            except OSError:
                pass
            await asyncio.to_thread(self._proc.join, 10.0)
            if self._proc.is_alive():
                self._proc.kill()

    @property
    def alive(self) -> bool:
        return not self._lost and self._proc.is_alive()

    def _readable(self) -> None:
        try:
            kind, *args = self._pipe.recv()
        except (EOFError, OSError):
            self._on_lost()
            return
        if kind == "ack":
            fut = self._acks.pop(args[0], None)
            if fut is not None and not fut.done():
                fut.set_result(args[1])
            return
        events, updates, latest = args
        vars(self.engine).update(vars(latest))  # in place: the metrics collector holds this object
        for rid, update in updates.items():
            rec = self._recorders.get(rid)
            if rec is not None:
                rec.put(update)
        for ev in events:
            q = self._queues.get(ev.request_id)
            if q is not None:
                q.put_nowait(ev)

    def _on_lost(self) -> None:
        """The child died: every open request ends with an error event."""
        if self._loop is not None:
            self._loop.remove_reader(self._pipe.conn.fileno())
        self._lost = True
        log.error("the engine process exited (code %s)", self._proc.exitcode)
        for fut in self._acks.values():
            if not fut.done():
                fut.set_result(APIError(503, LOST, "server_error", None, "engine_unavailable"))
        self._acks.clear()
        now = time.perf_counter()
        for rid, q in self._queues.items():
            q.put_nowait(
                EngineEvent(
                    request_id=rid,
                    step=0,
                    new_tokens=[],
                    stable=0,
                    committed=[],
                    remasked=[],
                    canvas=None,
                    done=True,
                    finish_reason="error",
                    nfe=0,
                    prompt_tokens=0,
                    stats=RequestStats(now),
                    error=LOST,
                )
            )

    # ---- requests ------------------------------------------------------------------------------
    async def submit(self, req: EngineRequest) -> None:
        """Queue a request in the child (raises its ConfigError / EngineOverloaded here)."""
        self.start()
        if not self.alive:
            raise APIError(503, LOST + " (see /health)", "server_error", None, "engine_unavailable")
        rid = req.request_id
        ack = self._loop.create_future() if self._loop is not None else None
        assert ack is not None
        self._acks[rid] = ack
        self._queues[rid] = asyncio.Queue()
        if hasattr(req.constraint, "put"):
            self._recorders[rid] = req.constraint
        self.engine.num_waiting += 1  # until the next numbers arrive
        self._pipe.send("add", req)
        err = await ack
        if err is not None:
            self._forget(rid)
            raise err

    def _forget(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self._recorders.pop(rid, None)

    def events(self, request_id: str) -> AsyncGenerator[EngineEvent, None]:
        """The request's events until its final one. Leaving early cancels it in the child."""
        return until_done(self._queues[request_id], lambda done: self._leave(request_id, done))

    def _leave(self, request_id: str, finished: bool) -> None:
        self._forget(request_id)
        if not finished:
            self.cancel(request_id)

    def cancel(self, request_id: str) -> None:
        if self.alive:
            self._pipe.send("cancel", request_id)
