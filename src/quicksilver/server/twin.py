"""The AR twin: the embedded model's equal-size autoregressive baseline, served beside it.

``quicksilver serve`` on the embedded default also loads ``assets/model-ar`` under its own model id
(``quicksilver-ar``) so that a person can race the two on one prompt (the playground's race mode)
and a client can compare them through the same API. Requests name the model they want; ``ByModel``
hands each to the serving object of that model.

``AREngine`` has the engine's interface (add / cancel / step / has_work) over ``ar_stream``: one
step is one forward pass (one token) for every running request, so the server's phases, streaming,
``diffusing`` canvas chunks, stop strings and cancellation all work unchanged. The canvas of an AR
request is simply the tokens so far: no masked positions, one committed per forward pass.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine import EngineConfig, EngineEvent, EngineOverloaded, EngineRequest, RequestStats
from ..errors import ConfigError
from ..models.transformer import DiffusionLM
from ..sampling.autoregressive import ar_stream
from ..sampling.decoder import DecodeResult
from .async_engine import AsyncEngine
from .config import ServerConfig
from .generation import Backend

AR_SUFFIX = "-ar"  # the twin's id is the diffusion model's id plus this


def forced_prefix(prefill: dict[int, int] | None) -> list[int]:
    """A prefill the AR twin can honour: positions 0..k-1 (e.g. the reasoning phase's ``<think>``).
    Anything else is a skeleton with holes, which left-to-right decoding cannot fill."""
    if not prefill:
        return []
    if sorted(prefill) != list(range(len(prefill))):
        raise ConfigError(
            "the AR twin decodes left to right: structured output (a canvas skeleton) is not "
            "supported; use the diffusion model"
        )
    return [prefill[i] for i in range(len(prefill))]


@dataclass
class _ARLive:
    req: EngineRequest
    forced: list[int]  # emitted before the first sampled token
    stats: RequestStats
    gen: Generator[int, None, DecodeResult] | None = None
    tokens: list[int] = field(default_factory=list)
    nfe: int = 0


class AREngine:
    """Autoregressive requests interleaved: each step runs one forward pass (one token) for every
    running request, one request after the other (no batched forward); requests join and leave
    between steps."""

    def __init__(
        self, model: DiffusionLM, stop_ids: list[int], config: EngineConfig | None = None
    ) -> None:
        self.model, self.stop_ids = model, list(stop_ids)
        self.config = config or EngineConfig()
        self.max_context = int(model.config.max_seq_len)
        self._commands: collections.deque[tuple[str, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._waiting: collections.OrderedDict[str, _ARLive] = collections.OrderedDict()
        self._running: dict[str, _ARLive] = {}
        self.step_count = 0
        self.totals = collections.Counter[str]()
        self.failing_steps = 0  # steps in a row whose forwards all raised
        self.prefix_cache = None  # AR prompts are prefilled whole: no cross-request cache

    # ---- thread-safe commands -------------------------------------------------------------------
    def add(self, req: EngineRequest) -> None:
        if req.suffix:
            raise ConfigError("the AR twin cannot see a suffix; use the diffusion model")
        if req.constraint is not None:
            raise ConfigError(
                "the AR twin decodes without constraints (structured output, banned tokens); "
                "use the diffusion model"
            )
        forced = forced_prefix(req.prefill)
        req.sampler.validate(self.max_context, len(req.prompt_ids))
        if len(req.prompt_ids) + req.sampler.max_new_tokens > self.max_context:
            raise ConfigError(
                f"prompt ({len(req.prompt_ids)}) + max_new_tokens ({req.sampler.max_new_tokens}) "
                f"exceeds the context of {self.max_context}"
            )
        with self._lock:
            pending = len(self._waiting) + sum(1 for c, _ in self._commands if c == "add")
            if pending >= self.config.max_waiting:
                raise EngineOverloaded(f"{self.config.max_waiting} requests are already waiting")
            self._commands.append(("add", _ARLive(req, forced, RequestStats(req.arrival))))

    def cancel(self, request_id: str) -> None:
        self._commands.append(("cancel", request_id))

    # ---- state --------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._commands or self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ---- one step -----------------------------------------------------------------------------
    def _start(self, lv: _ARLive) -> None:
        s = lv.req.sampler
        stops = (self.stop_ids if s.stop_at_eos else []) + list(lv.req.stop_token_ids or [])
        lv.gen = ar_stream(
            self.model,
            list(lv.req.prompt_ids) + lv.forced,
            s.max_new_tokens - len(lv.forced),
            stops,
            s.temperature,
            s.top_p,
            s.seed,
        )

    def _advance(self, lv: _ARLive) -> tuple[list[int], str | None]:
        """One forward pass: (tokens final this step, finish reason when the request ended)."""
        assert lv.gen is not None
        new, lv.forced = lv.forced, []
        try:
            tok = next(lv.gen)
        except StopIteration as stop:
            lv.nfe = stop.value.nfe
            lv.tokens += new
            return new, stop.value.finish_reason
        lv.nfe += 1
        new = new + [tok]
        lv.tokens += new
        full = len(lv.tokens) >= lv.req.sampler.max_new_tokens
        return new, "length" if full else None

    def _event(
        self, lv: _ARLive, new: list[int], finish: str | None, error: str | None = None
    ) -> EngineEvent:
        done = finish is not None
        start = len(lv.tokens) - len(new)
        result = None
        if done:
            seconds = time.perf_counter() - (lv.stats.admitted or lv.stats.arrival)
            result = DecodeResult(list(lv.tokens), finish or "stop", lv.nfe, lv.nfe, 0, seconds)
        return EngineEvent(
            lv.req.request_id,
            self.step_count,
            new,
            len(lv.tokens),
            [(start + i, t) for i, t in enumerate(new)],
            [],
            list(lv.tokens) if lv.req.sampler.record_canvas else None,
            done,
            finish,
            lv.nfe,
            len(lv.req.prompt_ids),
            lv.stats,
            error,
            result,
        )

    def _drain(self, now: float) -> list[EngineEvent]:
        """Apply the queued adds and cancels, then admit waiting requests up to ``max_batch``."""
        events = []
        while self._commands:
            kind, arg = self._commands.popleft()
            if kind == "add":
                self._waiting[arg.req.request_id] = arg
                continue
            lv = self._waiting.pop(arg, None) or self._running.pop(arg, None)
            if lv is not None:
                if lv.gen is not None:
                    lv.gen.close()
                lv.stats.finished = now
                self.totals["requests_cancelled"] += 1
                events.append(self._event(lv, [], "cancelled"))
        while self._waiting and len(self._running) < self.config.max_batch:
            rid, lv = self._waiting.popitem(last=False)
            lv.stats.admitted = now
            self._start(lv)
            self._running[rid] = lv
        return events

    def step(self) -> list[EngineEvent]:
        events = self._drain(time.perf_counter())
        if not self._running:
            return events
        self.step_count += 1
        failed, live = 0, list(self._running.items())
        for rid, lv in live:
            try:
                new, finish = self._advance(lv)
                error = None
            except Exception as e:  # a failed forward fails its request, never the engine
                new, finish, error = [], "error", f"{type(e).__name__}: {e}"
                failed += 1
                self.totals["step_errors"] += 1
            now = time.perf_counter()
            self.totals["forward_passes"] += 1
            if new and lv.stats.first_token is None:
                lv.stats.first_token = now
            if new:
                lv.stats.token_times.append(now)
            if finish is not None:
                del self._running[rid]
                if lv.gen is not None:
                    lv.gen.close()
                lv.stats.finished = now
                self.totals["requests_" + finish] += 1
                self.totals["generated_tokens"] += len(lv.tokens)
            events.append(self._event(lv, new, finish, error))
        self.failing_steps = self.failing_steps + 1 if failed == len(live) else 0
        self.totals["steps"] += 1
        return events


def build_twin_backend(cfg: ServerConfig, name: str) -> Backend | None:
    """The AR twin of the embedded model, named ``name + AR_SUFFIX``, when this build ships one and
    the server runs the embedded default (no ``--model``, no ``--mock``, not ``--no-ar-twin``)."""
    from ..assets import embedded_ar_model_path

    path = embedded_ar_model_path()
    if not cfg.ar_twin or cfg.mock or cfg.model is not None or path is None:
        return None
    return ar_backend(path, name + AR_SUFFIX, cfg)


def ar_backend(path: Path, name: str, cfg: ServerConfig) -> Backend:
    """A causal checkpoint served by ``AREngine`` under ``name``."""
    import quicksilver

    from ..models.checkpoint import DTYPES as TORCH_DTYPES

    dtype = TORCH_DTYPES.get(cfg.dtype or "auto")  # auto: None, models/checkpoint.default_dtype
    pipe = quicksilver.load(
        path,
        dtype=dtype,
        device=cfg.device,
        cache="none",
        quantize=cfg.quantize,
        backend=cfg.backend,  # the same runtime as the model it is raced against
    )
    if pipe.config.attention != "causal":
        raise ConfigError(
            f"{path}: the AR twin must be a causal model, not {pipe.config.attention}"
        )
    pipe.model.eval()
    ecfg = EngineConfig(max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=0)
    return Backend(
        name,
        pipe.tokenizer,
        AsyncEngine(AREngine(pipe.model, list(pipe.stop_ids), ecfg)),
        pipe.config.max_seq_len,
        pipe.config.attention,
        list(pipe.stop_ids),
        pipe.config.mask_token_id,
        runtime=pipe.runtime,
    )


class ByModel:
    """Hands each request to the serving object of the model its ``model`` field names; requests
    naming no served model go to the default one (which accepts its aliases or answers 404)."""

    def __init__(self, default: Any, others: dict[str, Any]) -> None:
        self.default, self.others = default, others

    def pick(self, model: str | None) -> Any:
        return self.others.get(model or "", self.default)

    def create(self, req: Any, *args: Any) -> Any:
        return self.pick(req.model).create(req, *args)

    def stream(self, req: Any, *args: Any) -> Any:
        return self.pick(req.model).stream(req, *args)

    def check_model(self, model: str | None) -> None:
        self.pick(model).check_model(model)
