"""Prometheus metrics through ``prometheus_client``, in a registry of the app's own.

Names mirror vLLM's under the ``quicksilver:`` prefix (requests, prompt/generation tokens, TTFT,
inter-token latency, end-to-end latency, queue time), plus diffusion counters in the spirit of
vLLM's ``vllm:diffusion_*`` (denoising steps, forward passes, committed and re-masked tokens) and
a tokens-per-forward histogram. Every sample has a ``model_name`` label (escaped by the library, so
any served name gives a parsable exposition). The serving layer's counters and histograms are
library objects updated as requests go; the engine's numbers (its ``totals``, queue gauges, the
prefix cache's ``query_tokens``/``hit_tokens``) are read at scrape time by one custom collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .async_engine import EngineView

PREFIX = "quicksilver:"
LATENCY_BUCKETS = (
    *(0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000, 8000)
TPF_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)

# name -> (help, extra label names)
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "requests_total": ("HTTP requests received, by endpoint.", ("endpoint",)),
    "request_success_total": ("Finished choices, by finish reason.", ("finished_reason",)),
    "requests_aborted_total": ("Requests cancelled because the client went away.", ()),
    "requests_rejected_total": (
        "Requests refused, by reason (auth, overloaded, too_many, invalid).",
        ("reason",),
    ),
    "prompt_tokens_total": ("Prompt tokens of finished requests.", ()),
    "generation_tokens_total": ("Generated tokens of finished requests (reasoning included).", ()),
    "reasoning_tokens_total": ("Tokens generated in reasoning phases.", ()),
    "diffusion_remasked_tokens_total": ("Committed tokens re-masked by revision.", ()),
    "tool_calls_unavailable_total": (
        "Turns under tool_choice auto answered in text because no call fitted the context.",
        (),
    ),
    "structured_requests_total": (
        "Canvases decoded under a JSON schema (response_format or a tool call).",
        (),
    ),
}
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "time_to_first_token_seconds": ("Arrival to the first streamed token.", LATENCY_BUCKETS),
    "inter_token_latency_seconds": (
        "Time between successive token-bearing steps of a request.",
        LATENCY_BUCKETS,
    ),
    "e2e_request_latency_seconds": ("Arrival to the last token.", LATENCY_BUCKETS),
    "request_queue_time_seconds": ("Time waiting in the engine queue.", LATENCY_BUCKETS),
    "request_prompt_tokens": ("Prompt tokens per request.", TOKEN_BUCKETS),
    "request_generation_tokens": ("Generated tokens per request.", TOKEN_BUCKETS),
    "diffusion_tokens_per_forward": (
        "Committed output tokens per forward pass (TPF) per request.",
        TPF_BUCKETS,
    ),
}
# engine.totals key -> (metric name, help)
ENGINE_COUNTERS = {
    "steps": ("diffusion_denoising_steps_total", "Batched refinement steps the engine ran."),
    "forward_passes": ("diffusion_forward_passes_total", "Forward passes of the network."),
    "committed_tokens": (
        "diffusion_committed_tokens_total",
        "Canvas positions committed (revisions count again).",
    ),
    "step_errors": (
        "engine_step_errors_total",
        "Engine steps (or AR-twin forwards) that raised; their requests ended with an error.",
    ),
}


class EngineCollector(Collector):
    """The engine's numbers at scrape time: queue gauges, open HTTP requests, totals, prefix cache."""

    def __init__(self, model: str, engine: EngineView, open_requests: Callable[[], int]) -> None:
        self.model, self.engine, self.open_requests = model, engine, open_requests

    def _one(
        self,
        family: type[GaugeMetricFamily | CounterMetricFamily],
        name: str,
        help: str,
        value: float,
    ) -> Metric:
        m = family(PREFIX + name, help, labels=["model_name"])
        m.add_metric([self.model], value)
        return m

    def collect(self) -> Iterator[Metric]:
        e, g, c = self.engine, GaugeMetricFamily, CounterMetricFamily
        yield self._one(g, "num_requests_running", "Requests in the running batch.", e.num_running)
        yield self._one(g, "num_requests_waiting", "Requests waiting for the batch.", e.num_waiting)
        yield self._one(g, "num_requests_open", "HTTP requests being served.", self.open_requests())
        for key, (name, help) in ENGINE_COUNTERS.items():
            yield self._one(c, name, help, float(e.totals.get(key, 0)))
        pc = e.prefix_cache
        if pc is not None:  # hit rate = hits / queries
            q, h = float(pc.query_tokens), float(pc.hit_tokens)
            yield self._one(
                c, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", q
            )
            yield self._one(
                c, "prefix_cache_hits", "Prompt tokens served from the prefix cache.", h
            )


class Metrics:
    """The serving layer's counters and histograms, plus the engine collector, in one registry."""

    def __init__(
        self,
        model_name: str,
        engine: EngineView | None = None,
        open_requests: Callable[[], int] = lambda: 0,
    ) -> None:
        self.model = model_name
        self.registry = CollectorRegistry()
        self.counters = {
            name: Counter(PREFIX + name, help, ["model_name", *labels], registry=self.registry)
            for name, (help, labels) in COUNTERS.items()
        }
        self.hist = {
            name: Histogram(
                PREFIX + name, help, ["model_name"], buckets=buckets, registry=self.registry
            )
            for name, (help, buckets) in HISTOGRAMS.items()
        }
        if engine is not None:
            self.registry.register(EngineCollector(model_name, engine, open_requests))

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.counters[name].labels(model_name=self.model, **labels).inc(value)

    def observe(self, name: str, value: float) -> None:
        self.hist[name].labels(model_name=self.model).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
