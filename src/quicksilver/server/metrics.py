"""Prometheus metrics in the text exposition format, written by hand (no client library needed).

Names mirror vLLM's under the ``quicksilver:`` prefix (requests, prompt/generation tokens, TTFT,
inter-token latency, end-to-end latency, queue time), plus diffusion counters in the spirit of
vLLM's ``vllm:diffusion_*`` (denoising steps, forward passes, committed and re-masked tokens) and
a tokens-per-forward histogram. Engine-wide counters are read from ``engine.totals`` at scrape time,
the prefix cache's (``prefix_cache_queries_total``/``prefix_cache_hits_total``, in prompt tokens, as
vLLM's) from ``engine.prefix_cache`` when the engine has one.
"""

from __future__ import annotations

import threading
from typing import Any

PREFIX = "quicksilver:"
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000, 8000)
TPF_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)
# engine.totals key -> (metric name, help)
ENGINE_COUNTERS = {
    "steps": ("diffusion_denoising_steps_total", "Batched refinement steps the engine ran."),
    "forward_passes": ("diffusion_forward_passes_total", "Forward passes of the network."),
    "committed_tokens": (
        "diffusion_committed_tokens_total",
        "Canvas positions committed (revisions count again).",
    ),
}


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.count += 1
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1


class Metrics:
    """Counters and histograms of the serving layer; thread-safe updates, one text rendering."""

    HISTOGRAMS = {
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

    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self._lock = threading.Lock()
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.hist = {k: Histogram(b) for k, (_, b) in self.HISTOGRAMS.items()}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self.hist[name].observe(value)

    def get(self, name: str, **labels: str) -> float:
        return self.counters.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self, engine: Any, open_requests: int) -> str:
        lines: list[str] = []
        model = f'model_name="{self.model}"'

        def one(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {PREFIX}{name} {help}")
            lines.append(f"# TYPE {PREFIX}{name} {kind}")
            for labels, v in samples:
                lines.append(
                    f"{PREFIX}{name}{{{labels}}} {v:g}" if labels else f"{PREFIX}{name} {v:g}"
                )

        one(
            "num_requests_running",
            "gauge",
            "Requests in the running batch.",
            [(model, engine.num_running)],
        )
        one(
            "num_requests_waiting",
            "gauge",
            "Requests waiting for the batch.",
            [(model, engine.num_waiting)],
        )
        one("num_requests_open", "gauge", "HTTP requests being served.", [(model, open_requests)])
        with self._lock:
            by_name: dict[str, list[tuple[str, float]]] = {}
            for (name, labels), v in sorted(self.counters.items()):
                lab = ",".join([model] + [f'{k}="{val}"' for k, val in labels])
                by_name.setdefault(name, []).append((lab, v))
            for name, samples in by_name.items():
                one(name, "counter", COUNTER_HELP.get(name, name), samples)
            for key, (metric, help) in ENGINE_COUNTERS.items():
                one(metric, "counter", help, [(model, float(engine.totals.get(key, 0)))])
            pc = getattr(engine, "prefix_cache", None)
            if pc is not None:  # hit rate = hits / queries
                one(
                    "prefix_cache_queries_total",
                    "counter",
                    "Prompt tokens looked up in the prefix cache.",
                    [(model, float(pc.query_tokens))],
                )
                one(
                    "prefix_cache_hits_total",
                    "counter",
                    "Prompt tokens served from the prefix cache.",
                    [(model, float(pc.hit_tokens))],
                )
            for name, h in self.hist.items():
                lines.append(f"# HELP {PREFIX}{name} {self.HISTOGRAMS[name][0]}")
                lines.append(f"# TYPE {PREFIX}{name} histogram")
                for b, c in zip(h.buckets, h.counts):
                    lines.append(f'{PREFIX}{name}_bucket{{{model},le="{b:g}"}} {c}')
                lines.append(f'{PREFIX}{name}_bucket{{{model},le="+Inf"}} {h.count}')
                lines.append(f"{PREFIX}{name}_sum{{{model}}} {h.sum:g}")
                lines.append(f"{PREFIX}{name}_count{{{model}}} {h.count}")
        return "\n".join(lines) + "\n"


COUNTER_HELP = {
    "requests_total": "HTTP requests received, by endpoint.",
    "request_success_total": "Finished choices, by finish reason.",
    "requests_aborted_total": "Requests cancelled because the client went away.",
    "requests_rejected_total": "Requests refused, by reason (overloaded, too_many, invalid).",
    "prompt_tokens_total": "Prompt tokens of finished requests.",
    "generation_tokens_total": "Generated tokens of finished requests (reasoning included).",
    "reasoning_tokens_total": "Tokens generated in reasoning phases.",
    "diffusion_remasked_tokens_total": "Committed tokens re-masked by revision.",
    "structured_requests_total": "Choices decoded under a JSON schema (response_format or tool_choice).",
}
