"""The engine: owns requests, admits them into a running batch, steps the batch, emits events.

Synchronous and unit-testable: ``add`` and ``cancel`` may be called from any thread (they only
queue commands); ``step`` runs one batched refinement step over the running requests (continuous
batching: requests join and leave between steps, each with its own sampler settings, canvas and
cache) and returns one ``EngineEvent`` per request touched. The server wraps it in a thread and
asyncio; benchmarks and the CLI drive it directly. The engine speaks token ids only.

Threads: the one rule is that ``_commands``, ``_queued_adds`` and ``_pending_ids`` — the only state
other threads touch — are read and written under ``_lock``, always; the engine thread takes the
whole command queue in one swap under the lock at the start of a step. Everything else
(``_waiting``, ``_running``, rows, caches) belongs to the thread that calls ``step``; other threads
only read sizes of it (``num_running``, ``num_waiting``), which is atomic.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, Literal

from ..errors import ConfigError, QuicksilverError
from ..sampling import SamplerConfig
from ..sampling.core.hooks import Constraint
from ..sampling.core.state import DecodeResult
from ..sampling.decoders.row_decoder import R, RowDecoder, release
from .prefix_cache import PrefixCache


class EngineOverloaded(QuicksilverError):
    """The waiting queue is full; try again later (HTTP 503/429)."""


@dataclass
class EngineConfig:
    max_batch: int = 16  # requests in one forward pass
    max_batch_tokens: int = 8192  # tokens in one forward pass (bounds step latency and memory)
    max_waiting: int = 256  # queued requests before add() refuses
    prefix_cache_mb: int = 256  # cross-request prefix cache (block-causal, causal); 0: off


@dataclass
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    sampler: SamplerConfig
    prefill: dict[int, int] | None = None  # canvas skeleton (structured output)
    suffix: list[int] | None = None  # tokens after the canvas (infilling)
    constraint: Constraint | None = None
    arrival: float = field(default_factory=time.perf_counter)
    # extra stop tokens for this request (e.g. </think> ends reasoning)
    stop_token_ids: list[int] | None = None


@dataclass
class RequestStats:
    arrival: float
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)  # when each stable chunk was emitted

    @property
    def queue_time(self) -> float:
        return (self.admitted or self.arrival) - self.arrival

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class EngineEvent:
    """What one step did for one request."""

    request_id: str
    step: int
    new_tokens: list[int]  # tokens that became final this step (the append-only stream)
    stable: int  # tokens final so far
    committed: list[tuple[int, int]]  # (position, token) committed this step (diffusing views)
    remasked: list[int]
    canvas: list[int] | None  # whole live canvas (mask id where masked) when record_canvas
    done: bool
    finish_reason: str | None  # stop | length | cancelled | error
    nfe: int
    prompt_tokens: int
    stats: RequestStats
    error: str | None = None
    result: DecodeResult | None = None
    cached_tokens: int = 0  # prompt tokens served by the prefix cache


@dataclass
class _Live(Generic[R]):
    req: EngineRequest
    row: R
    stats: RequestStats
    emitted: int = 0
    prompt_cached: int = 0  # prompt tokens served by the prefix cache


# a queued command: ("add", the request's live state) or ("cancel", its id)
Command = tuple[Literal["add"], _Live[R]] | tuple[Literal["cancel"], str]


class Engine(Generic[R]):
    """Continuous batching over the decoder's rows."""

    def __init__(self, decoder: RowDecoder[R], config: EngineConfig | None = None) -> None:
        self.decoder = decoder
        self.config = config or EngineConfig()
        self._commands: collections.deque[Command[R]] = collections.deque()
        self._queued_adds = 0  # "add" commands in _commands
        self._lock = threading.Lock()  # guards _commands, _queued_adds, _pending_ids
        self._waiting: collections.OrderedDict[str, _Live[R]] = collections.OrderedDict()
        self._running: dict[str, _Live[R]] = {}
        self._pending_ids: set[str] = set()
        self.step_count = 0
        self.totals = collections.Counter[str]()
        self.failing_steps = 0  # steps in a row that raised (0 after one that did not)
        mcfg = decoder.runtime.config
        self.prefix_cache: PrefixCache | None = None
        if self.config.prefix_cache_mb > 0 and decoder.resolve_cache_mode() in ("block", "verify"):
            self.prefix_cache = PrefixCache(
                mcfg.block_size,
                self.config.prefix_cache_mb << 20,
                prompt_only=getattr(decoder.runtime, "step_backend", None) is not None,
            )

    # ---- thread-safe commands -------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        """Validate and queue a request. Raises ConfigError on bad input, EngineOverloaded when full."""
        row = self.decoder.new_row(
            req.prompt_ids,
            req.sampler,
            tag=req.request_id,
            prefill=req.prefill,
            suffix=req.suffix,
            constraint=req.constraint,
            extra_stops=req.stop_token_ids,
        )
        with self._lock:
            if req.request_id in self._pending_ids:
                raise ConfigError(f"duplicate request id {req.request_id!r}")
            if len(self._waiting) + self._queued_adds >= self.config.max_waiting:
                raise EngineOverloaded(f"{self.config.max_waiting} requests are already waiting")
            self._pending_ids.add(req.request_id)
            self._commands.append(("add", _Live(req, row, RequestStats(req.arrival))))
            self._queued_adds += 1

    def cancel(self, request_id: str) -> None:
        """Drop a request before the next step (its canvas and cache are freed)."""
        with self._lock:
            self._commands.append(("cancel", request_id))

    # ---- state --------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        with self._lock:
            queued = bool(self._commands)
        return bool(queued or self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests waiting for the batch, those still in the command queue included."""
        return len(self._waiting) + self._queued_adds

    def cache_bytes(self) -> int:
        return sum(
            lv.row.cache.nbytes() for lv in self._running.values() if lv.row.cache is not None
        )

    # ---- one step -----------------------------------------------------------------------------
    def _take_commands(self) -> list[Command[R]]:
        """The adds and cancels queued since the last step (lockstep.py shares them with peers)."""
        with self._lock:
            commands, self._commands = self._commands, collections.deque()
            self._queued_adds = 0
        return list(commands)

    def _drain(self, now: float) -> list[EngineEvent]:
        events = []
        for _, arg in self._take_commands():
            if isinstance(arg, _Live):
                self._waiting[arg.req.request_id] = arg
            else:
                lv = self._waiting.pop(arg, None) or self._running.pop(arg, None)
                if lv is not None:
                    events.append(self._final(lv, "cancelled", now))
        return events

    def _admit(self, now: float) -> None:
        budget = self.config.max_batch_tokens - sum(
            lv.row.input_len() for lv in self._running.values()
        )
        while self._waiting and len(self._running) < self.config.max_batch:
            rid, lv = next(iter(self._waiting.items()))
            need = lv.row.input_len()
            if need > budget and self._running:
                break  # wait for room; a lone request is always admitted
            self._waiting.popitem(last=False)
            if self.prefix_cache is not None:
                lv.prompt_cached = self.prefix_cache.attach(lv.row)
            lv.stats.admitted = now
            self._running[rid] = lv
            budget -= need

    def _final(self, lv: _Live, reason: str, now: float, error: str | None = None) -> EngineEvent:
        with self._lock:
            self._pending_ids.discard(lv.req.request_id)
        lv.stats.finished = now
        self.totals["requests_" + reason] += 1
        res = lv.row.result()
        if reason in ("cancelled", "error"):
            res.finish_reason = reason
        if reason == "cancelled":  # a failed step may have left its cache's bindings half-written
            release(lv.row)
        return EngineEvent(
            request_id=lv.req.request_id,
            step=self.step_count,
            new_tokens=[],
            stable=lv.emitted,
            committed=[],
            remasked=[],
            canvas=None,
            done=True,
            finish_reason=reason,
            nfe=lv.row.nfe,
            prompt_tokens=lv.row.P,
            stats=lv.stats,
            error=error,
            result=res,
            cached_tokens=lv.prompt_cached,
        )

    def step(self) -> list[EngineEvent]:
        now = time.perf_counter()
        events = self._drain(now)
        self._admit(now)
        if not self._running:
            return events
        self.step_count += 1
        live = list(self._running.values())
        try:
            row_events = self.decoder.step([lv.row for lv in live])
        except Exception as e:  # a failed step fails its requests, never the engine
            self.totals["step_errors"] += 1
            self.failing_steps += 1
            now = time.perf_counter()
            for lv in live:
                del self._running[lv.req.request_id]
                events.append(self._final(lv, "error", now, f"{type(e).__name__}: {e}"))
            return events
        now = time.perf_counter()
        self.failing_steps = 0
        self.totals["steps"] += 1
        self.totals["forward_passes"] += 1
        for lv, ev in zip(live, row_events):
            row = lv.row
            if self.prefix_cache is not None and (row.nfe == 1 or ev.done):
                self.prefix_cache.insert(row)
            self.totals["committed_tokens"] += len(ev.committed)
            new = row.host_tokens[lv.emitted : ev.stable] if ev.stable > lv.emitted else []
            if new:
                lv.emitted = ev.stable
                if lv.stats.first_token is None:
                    lv.stats.first_token = now
                lv.stats.token_times.append(now)
            if ev.done:
                del self._running[lv.req.request_id]
                with self._lock:
                    self._pending_ids.discard(lv.req.request_id)
                lv.stats.finished = now
                self.totals["requests_" + (ev.finish_reason or "length")] += 1
                self.totals["generated_tokens"] += ev.end
            events.append(
                EngineEvent(
                    request_id=lv.req.request_id,
                    step=self.step_count,
                    new_tokens=new,
                    stable=lv.emitted,
                    committed=ev.committed,
                    remasked=ev.remasked,
                    canvas=ev.canvas,
                    done=ev.done,
                    finish_reason=ev.finish_reason,
                    nfe=row.nfe,
                    prompt_tokens=row.P,
                    stats=lv.stats,
                    result=row.result() if ev.done else None,
                    cached_tokens=lv.prompt_cached,
                )
            )
            if ev.done:
                release(row)
        return events

    def run_until_idle(self) -> Iterator[EngineEvent]:
        """Step until nothing is left (offline use: CLI, benchmarks, tests)."""
        while self.has_work:
            yield from self.step()
