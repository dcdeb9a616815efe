"""``ServerConfig``: every server option, one CLI flag per field, with hard limits as named constants.
The flags in ``SERVER_HIDDEN`` parse as before but stay out of ``serve --help``.

Limits are checked before any work is queued, so one request can never ask for unbounded memory or
time (body size, prompt tokens, ``max_tokens``, ``n``, messages, tools, stop strings); the engine's
queue bound turns overload into 503 and the open-request bound into 429.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..pipeline import LOAD_CHOICES, LOAD_HELP, LoadConfig

MAX_BODY_BYTES = 2 * 1024 * 1024  # request body (TGI's --payload-limit default is 2 MB)
MAX_PROMPT_TOKENS = 8192  # further bounded by the model's context
MAX_TOKENS = 4096  # upper bound for max_tokens / max_completion_tokens
DEFAULT_MAX_TOKENS = 256  # when the request names none (bounded by what fits the context)
MAX_N = 8
MAX_MESSAGES = 256
MAX_TOOLS = 64
MAX_STOP = 8  # stop strings per request
MAX_STOP_CHARS = 256  # characters per stop string
MAX_CONCURRENT = 64  # open requests before 429
MAX_WAITING = 256  # engine queue before 503
MAX_REASONING_TOKENS = 1024  # the reasoning phase's budget never exceeds this
MAX_TOOL_CALLS = 8  # calls in one turn with parallel_tool_calls
MAX_TOP_LOGPROBS = 20
HEADER_TIMEOUT = 10.0  # seconds a connection has to send a whole request head (closed after)
BODY_TIMEOUT = 10.0  # seconds to receive a request body once its headers are in (408 after)
REQUEST_TIMEOUT = 600.0  # seconds a generating request may run (0: no limit)
DRAIN_TIMEOUT = 30.0  # on SIGTERM/SIGINT: seconds in-flight requests get to finish
API_KEY_ENV = "QUICKSILVER_API_KEY"


@dataclass
class ServerConfig(LoadConfig):
    """The server's options after the model's load options (``LoadConfig``)."""

    # served rows and batches on the machine's fastest step (LoadConfig: torch)
    backend: str = "auto"
    model: str | None = None  # checkpoint directory or Hub id (default: the embedded model)
    # the id clients send as `model` (default: quicksilver or the dir name)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None  # protects every route but /health (also QUICKSILVER_API_KEY)
    ar_twin: bool = True  # with the embedded default: also serve its AR twin as `<name>-ar`
    # with the embedded default: also serve the edit model as `<name>-edit` (the edit routes' default)
    edit_model: bool = True
    allowed_origins: str | None = None  # comma-separated origins allowed cross-origin ('*': any)
    mock: bool = False  # serve the scripted mock engine (no weights; for demos and protocol tests)
    warmup: bool = True  # compile the exported step's shapes at load (no request pays a compile)
    prefix_cache_mb: int = 256  # cross-request prefix cache, block-causal and causal (0: off)
    threads: int = 0  # torch intra-op threads (0: leave the default)
    engine: str = "thread"  # where the engine steps: thread (in the server) | process (its own)
    max_body_bytes: int = MAX_BODY_BYTES
    max_prompt_tokens: int = MAX_PROMPT_TOKENS
    max_tokens: int = MAX_TOKENS
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_n: int = MAX_N
    max_messages: int = MAX_MESSAGES
    max_tools: int = MAX_TOOLS
    max_stop: int = MAX_STOP
    max_concurrent: int = MAX_CONCURRENT
    max_waiting: int = MAX_WAITING
    max_batch: int = 16  # requests stepped together in one forward pass
    max_reasoning_tokens: int = MAX_REASONING_TOKENS
    max_tool_calls: int = MAX_TOOL_CALLS  # calls one turn may make (parallel_tool_calls)
    chat_template: str | None = None  # a Jinja chat template file replacing the checkpoint's
    json_string_tokens: int = 24  # structured output: token budget of a free string value
    json_number_tokens: int = 12  # ... of a number (integers get this minus 2)
    json_object_tokens: int = 64  # ... of a free-form object nested in a schema
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    request_timeout: float = REQUEST_TIMEOUT
    drain_timeout: float = DRAIN_TIMEOUT
    verify_checksum: bool = False  # check the weights against model.sha256 before serving
    log_level: str = "warning"
    # scale-out (docs/SCALING.md): Ray Serve replicas, routing, autoscaling, tensor parallelism
    replicas: int = 0  # Ray Serve replicas of the app behind one endpoint (0: one process, no Ray)
    ray_address: str | None = None  # join this Ray cluster (e.g. auto, or HOST:6379)
    routing: str = "prefix"  # prefix (the replica holding the prompt's prefix) | random
    min_replicas: int = 0  # autoscaling lower bound (with --max-replicas)
    max_replicas: int = 0  # autoscaling upper bound (0: a fixed --replicas count)
    target_ongoing_requests: float = 2.0  # autoscaling: ongoing requests per replica to aim for
    tensor_parallel: int = 1  # processes (GPUs) one model is split over (torch.distributed)

    def resolved_api_key(self) -> str | None:
        return self.api_key or os.environ.get(API_KEY_ENV) or None


SERVER_HELP = LOAD_HELP | {
    "model": "checkpoint directory or Hub id org/name[@revision] (default: the embedded model)",
    "served_model_name": "model id clients send and /v1/models lists",
    "api_key": f"require 'Authorization: Bearer KEY' on every route but /health (env {API_KEY_ENV})",
    "ar_twin": "with the embedded model, also serve its autoregressive twin (model id quicksilver-ar)",
    "edit_model": "with the embedded model, also serve the edit model (model id quicksilver-edit), "
    "which the apply and next-edit routes use unless a request names another served model",
    "allowed_origins": "comma-separated origins a browser may call this server from (CORS; '*': any); "
    "other cross-origin requests get 403",
    "mock": "serve the scripted mock engine instead of a model (no weights)",
    "engine": "where each engine steps: a thread of the server, or a process of its own (the HTTP "
    "loop then never shares an interpreter with a step)",
    "warmup": "compile the exported step's decode shapes and prompt shapes up to 256 tokens at load, "
    "so that no request pays a compile (~0.3 s and ~35 MB a shape on the shipped model)",
    "prefix_cache_mb": "cross-request prefix cache for block-causal and causal models, in MiB (0: off)",
    "max_body_bytes": "largest request body accepted (413 above)",
    "max_prompt_tokens": "longest prompt accepted, in tokens (400 above)",
    "max_tokens": "largest max_tokens a request may ask for (400 above)",
    "default_max_tokens": "max_tokens when a request names none",
    "max_n": "most choices per request",
    "max_concurrent": "open requests before 429",
    "max_waiting": "queued engine requests before 503",
    "max_reasoning_tokens": "cap of the reasoning phase's own budget",
    "max_tool_calls": "most tool calls in one turn (parallel_tool_calls)",
    "chat_template": "a Jinja chat template file to use instead of the checkpoint's (sandboxed)",
    "header_timeout": "seconds a connection has to send a request's headers (closed after)",
    "body_timeout": "seconds to receive a request body after its headers (408 after)",
    "request_timeout": "seconds a generating request may run before it is cancelled (0: no limit)",
    "drain_timeout": "on SIGTERM/SIGINT, seconds in-flight requests get to finish (then error + [DONE])",
    "replicas": "run N replicas on Ray Serve behind one endpoint (0: one process, no Ray)",
    "ray_address": "join a running Ray cluster (auto, or HOST:PORT) instead of starting one",
    "routing": "how the Ray ingress picks a replica: prefix (cache-aware) or random",
    "min_replicas": "autoscaling: fewest replicas (with --max-replicas)",
    "max_replicas": "autoscaling: most replicas (0: a fixed --replicas count)",
    "target_ongoing_requests": "autoscaling: ongoing requests per replica Ray Serve aims for",
    "tensor_parallel": "split the model over N processes/GPUs (torch.distributed tensor parallelism)",
    "verify_checksum": "refuse to serve weights that do not match the checkpoint's model.sha256",
    "host": "address to listen on",
    "port": "port to listen on",
    "threads": "torch intra-op threads (0: torch's default)",
    "max_messages": "most messages in one chat request",
    "max_tools": "most tools in one request",
    "max_stop": "most stop strings in one request (each up to 256 characters)",
    "max_batch": "requests stepped together in one forward pass",
    "json_string_tokens": "structured output: masked positions a free string value gets",
    "json_number_tokens": "structured output: masked positions a number gets (integers 2 fewer)",
    "json_object_tokens": "structured output: masked positions a free-form nested object gets",
    "log_level": "uvicorn's log level (info: one line per request)",
}
SERVER_CHOICES = LOAD_CHOICES | {"engine": ("thread", "process")}

# Flags that still parse (they are documented, so they are contracts) but stay out of --help:
# measured of no use on any target served, or explicit choices that the default `auto` makes.
LOAD_HIDDEN = frozenset(
    {
        "refresh_every",  # approximate caches of bidirectional models: no served model is one
        "compile",  # torch.compile: measured slower on a 2-core CPU; rows step on exported passes
        "attention_layout",  # auto: flex on a GPU, per sequence on a CPU
        "cuda_graphs",  # static shapes for a GPU: never measured to help a served request
    }
)
SERVER_HIDDEN = LOAD_HIDDEN | {
    "cache",  # auto: the exact cache of the model's attention; the rest are for experiments
    "routing",  # random: the benchmarks' baseline (prefix routing measured 34% faster)
}
