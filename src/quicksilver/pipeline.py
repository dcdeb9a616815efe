"""``quicksilver.load(path)``: a loaded model with its tokenizer and a one-call ``generate``.

The network is the generic ``Transformer`` (mask-diffusion and causal families: ``Decoder`` or
``VerifyDecoder``, ``sampling/decoders.decoder_for``) or a family's own (DiffusionGemma's
``DiffusionGemmaLM``: ``NoiseCanvasDecoder``, its settings from the checkpoint's
``generation_config.json``). The load options that only the generic transformer has (other
backends, int8, compile, CUDA graphs, the attention layout, other caches, decoding modes) are
one-line errors for the others rather than silently ignored.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError, ConfigError
from .hub import resolve_model
from .models.checkpoint import (
    DTYPES,
    NETWORK_LOADERS,
    Network,
    State,
    architecture,
    build_model,
    default_model_dtype,
    device_of,
    dtype_name,
    load_family_network,
    load_tokenizer,
    read_checkpoint,
)
from .models.config import ModelConfig
from .models.families import generation_defaults
from .models.families.diffusion_gemma_net import DiffusionGemmaLM
from .models.transformer import Transformer
from .runtime import Runtime
from .runtime.cpu_backends import BACKEND_CHOICES, attach_backend
from .runtime.packing import LAYOUTS, resolve_layout
from .runtime.quantize import (
    QUANTIZE_CHOICES,
    check_mode,
    graph_format,
    quantize,
    quantized_network,
    quantized_runtime,
)
from .sampling import SamplerConfig
from .sampling.core.caches import CACHE_CHOICES
from .sampling.core.state import RowEvent
from .sampling.decoders import VerifyDecoder, decoder_for
from .sampling.decoders.diffusion import Decoder
from .sampling.decoders.noise_canvas import NoiseCanvasConfig
from .sampling.decoders.noise_decoder import NoiseCanvasDecoder
from .tokenizer import Tokenizer

Messages = list[dict[str, Any]]
NO_MASK = -1  # Pipeline.mask_id of a network whose canvases have no mask token


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    finish_reason: str
    nfe: int
    steps: int
    tpf: float
    seconds: float
    prompt_tokens: int
    revisions: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Pipeline:
    """A model, its tokenizer and the decoder; what ``quicksilver.load`` returns."""

    def __init__(
        self,
        model: Network,
        tokenizer: Tokenizer,
        path: str | Path | None = None,
        cache: str = "auto",
        refresh_every: int = 0,
        decoding_mode: str | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.network = model
        # how the generic transformer runs here (None for a family's own network)
        if runtime is None and isinstance(model, Transformer):
            runtime = Runtime(model)
        self._runtime = runtime
        self.tokenizer = tokenizer
        self.path = Path(path) if path is not None else None
        # The family's published decoding settings, in its decoding mode (+ the checkpoint's
        # sampler_config.json): the base that every request's options are applied on (CLI flags,
        # API fields).
        self.generation_defaults: dict[str, Any] = generation_defaults(
            model.config.architecture,
            self.path,
            [f.name for f in fields(SamplerConfig)],
            decoding_mode,
        )
        self.decoder: Decoder | VerifyDecoder | NoiseCanvasDecoder
        if self._runtime is not None:
            self.decoder = self._transformer_decoder(self._runtime, cache, refresh_every)
        elif isinstance(model, DiffusionGemmaLM):
            self.decoder = self._noise_decoder(model)
        else:
            raise ConfigError(f"no decoder runs a {type(model).__name__}")
        if isinstance(self.decoder, VerifyDecoder):  # lossless by default: the model's AR output
            self.generation_defaults.setdefault("policy", "verify")

    def _transformer_decoder(
        self, model: Runtime, cache: str, refresh_every: int
    ) -> Decoder | VerifyDecoder:
        tokenizer, cfg = self.tokenizer, model.config
        if tokenizer.mask_id is not None and tokenizer.mask_id != cfg.mask_token_id:
            raise CheckpointError(
                f"tokenizer mask id {tokenizer.mask_id} differs from config {cfg.mask_token_id}"
            )
        self.stop_ids = sorted(set(cfg.eos_token_ids) | set(tokenizer.stop_ids))
        pad = tokenizer.pad_id if tokenizer.pad_id is not None else cfg.eos_token_ids[0]
        return decoder_for(
            model,
            self.stop_ids,
            pad_id=pad,
            vocab_limit=tokenizer.vocab_size,
            cache_mode=cache,
            refresh_every=refresh_every,
        )

    def _noise_decoder(self, model: DiffusionGemmaLM) -> NoiseCanvasDecoder:
        """DiffusionGemma: its settings from ``generation_config.json``, its stop tokens from that,
        config.json and the tokenizer."""
        base = (
            NoiseCanvasConfig()
            if self.path is None
            else NoiseCanvasConfig.from_checkpoint(self.path)
        )
        cfg = model.config
        stops = set(cfg.eos_token_ids) | set(self.tokenizer.stop_ids) | set(base.eos_token_ids)
        self.stop_ids = sorted(stops)
        pads = (base.pad_token_id, cfg.pad_token_id, self.tokenizer.pad_id, 0)
        self.generation_defaults.setdefault("max_new_tokens", base.max_new_tokens)
        return NoiseCanvasDecoder(
            model, base, self.stop_ids, next(p for p in pads if p is not None)
        )

    @property
    def model(self) -> Transformer:
        """``network`` as the generic transformer, which benchmarks, distillation, tensor
        parallelism and export drive; a one-line ConfigError for a network of a family's own."""
        if not isinstance(self.network, Transformer):
            raise ConfigError(
                f"{self.network.config.architecture} runs a network of its own; this needs the "
                "generic transformer"
            )
        return self.network

    @property
    def runtime(self) -> Runtime:
        """How ``model`` runs here (caches, step backend, quantized format, planner); the same
        one-line ConfigError for a network of a family's own."""
        if self._runtime is None:
            raise ConfigError(
                f"{self.network.config.architecture} runs a network of its own; this needs the "
                "generic transformer"
            )
        return self._runtime

    @property
    def config(self) -> ModelConfig:
        """The generic transformer's ``ModelConfig`` (``model``'s; the same one-line error)."""
        return self.model.config

    @property
    def max_context(self) -> int:
        return self.network.config.max_seq_len

    @property
    def attention(self) -> str:
        """The attention pattern decoding runs under: a DiffusionGemma canvas attends both ways
        within itself and causally to what precedes it (block-causal, one canvas a block)."""
        net = self.network
        return net.config.attention if isinstance(net, Transformer) else "block_causal"

    @property
    def mask_id(self) -> int:
        """The mask token (where a live view draws an undecided position); -1 for a canvas of noise,
        which has none."""
        net = self.network
        return net.config.mask_token_id if isinstance(net, Transformer) else NO_MASK

    @property
    def runtime_name(self) -> str:
        """What runs every row's passes (``--backend`` resolved): torch, onnx, openvino or
        openvino-bf16. Passes no exported bucket holds run in torch."""
        return "torch" if self._runtime is None else self._runtime.name

    def warm_up(self) -> int:
        """Compile the step backend's shapes ahead of the first requests (``ExportedStep.warm``);
        returns how many (0 on torch, which compiles nothing)."""
        return 0 if self._runtime is None else self._runtime.warm(self.max_context)

    def encode_prompt(
        self, prompt: str | Messages, chat: bool | None = None, **template_kwargs: Any
    ) -> list[int]:
        """Token ids of a plain prompt, or of messages rendered through the chat template."""
        if isinstance(prompt, str):
            if chat:
                prompt = [{"role": "user", "content": prompt}]
            else:
                ids = self.tokenizer.encode(prompt)
                if not ids:
                    raise ConfigError("the prompt is empty")
                return ids
        if not isinstance(prompt, list) or not all(
            isinstance(m, dict) and "role" in m for m in prompt
        ):
            raise ConfigError("messages must be a list of {'role': ..., 'content': ...} objects")
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(prompt, **template_kwargs))

    def sampler_config(self, **options: Any) -> SamplerConfig:
        """The family's defaults with ``options`` applied on top."""
        return SamplerConfig().replace(**{**self.generation_defaults, **options})

    def stream(
        self, prompt: str | Messages, chat: bool | None = None, **options: Any
    ) -> Generator[RowEvent, None, GenerationResult]:
        """Yield every step's event for one prompt; return the GenerationResult."""
        ids = self.encode_prompt(prompt, chat)
        cfg = self.sampler_config(**options)
        t0 = time.perf_counter()
        drive = self.decoder.run([ids], cfg)
        while True:
            try:
                yield from next(drive)
            except StopIteration as stop:
                res = stop.value[0]
                break
        return GenerationResult(
            self.tokenizer.decode(res.tokens),
            res.tokens,
            res.finish_reason,
            res.nfe,
            res.steps,
            res.tpf,
            time.perf_counter() - t0,
            len(ids),
            res.revisions,
        )

    def generate(
        self, prompt: str | Messages, chat: bool | None = None, **options: Any
    ) -> GenerationResult:
        gen = self.stream(prompt, chat, **options)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def generate_batch(
        self, prompts: Sequence[str | Messages], chat: bool | None = None, **options: Any
    ) -> list[GenerationResult]:
        """Decode several prompts in one batch (one forward per step for all of them)."""
        ids = [self.encode_prompt(p, chat) for p in prompts]
        cfg = self.sampler_config(**options)
        t0 = time.perf_counter()
        results = self.decoder.generate(ids, cfg)
        dt = time.perf_counter() - t0
        return [
            GenerationResult(
                self.tokenizer.decode(r.tokens),
                r.tokens,
                r.finish_reason,
                r.nfe,
                r.steps,
                r.tpf,
                dt,
                len(i),
                r.revisions,
            )
            for r, i in zip(results, ids)
        ]


DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")  # auto: models/checkpoint.default_dtype


@dataclass
class LoadConfig:
    """How a checkpoint is loaded and run: the options of ``quicksilver.load``, of every command
    that loads a model (one flag per field, help text from ``LOAD_HELP``) and of ``ServerConfig``,
    which extends it. One default each, here."""

    device: str | None = None
    dtype: str = "auto"
    quantize: str = "none"
    backend: str = "torch"
    cache: str = "auto"
    refresh_every: int = 0
    compile: bool = False
    attention_layout: str = "auto"
    cuda_graphs: bool = False
    revision: str | None = None
    decoding_mode: str | None = None

    def load_options(self) -> dict[str, Any]:
        """The fields as ``load``'s keyword options."""
        return {f.name: getattr(self, f.name) for f in fields(LoadConfig)}


LOAD_HELP = {
    "device": "torch device, e.g. cuda or cuda:1 (default: the CPU)",
    "dtype": "compute dtype; auto: bfloat16 on a GPU and for CPU models of 0.5B+ parameters, "
    "float32 below (faster there, and what the onnx/openvino backends run)",
    "quantize": "weight-only int8 (per channel) or int4 (groups of 128) on the CPU, built while "
    "loading (1/4 and 1/7 of float32 weight memory): dense networks on OpenVINO's kernels, every "
    "pass through them; mixture-of-experts networks (LLaDA-MoE, LLaDA2.x, DiffusionGemma) on "
    "torch's weight-only kernels, one call per active expert; fp8: e4m3 weights with per-channel "
    "scales on GPUs with FP8 tensor cores (compute capability 8.9+)",
    "backend": "runtime of every row's pass, alone or batched (a row's tokens never depend on "
    "its neighbours): torch (eager, the exact reference), onnx (ONNX Runtime), openvino, "
    "openvino-bf16 (OpenVINO in bf16, CPUs with bf16 only), auto (the measured winner on a "
    "float32 CPU model, else torch; the server's default)",
    "cache": "KV cache: auto (exact block cache for block-causal models), none, block, or the "
    "approximate prefix/dual caches for bidirectional models",
    "refresh_every": "approximate caches: also recompute everything every N steps "
    "(0: at block starts only)",
    "compile": "torch.compile the per-token parts of each block (GPU; measured slower on a "
    "2-core CPU)",
    "attention_layout": "attention over a batch: per_sequence, batched (one call per layer over "
    "padded rows), flex (one FlexAttention call per layer over the paged KV pool), auto (flex on "
    "a GPU, per_sequence on a CPU)",
    "cuda_graphs": "static bucketed shapes + torch.compile(mode='reduce-overhead') (GPU): whole "
    "steps under the flex layout",
    "revision": "branch, tag or commit of a Hub id --model (same as org/name@REVISION)",
    "decoding_mode": "the family's named decoding settings (LLaDA2.1: quality, its default, or "
    "speed); default: the family's published ones",
}
LOAD_CHOICES: dict[str, Sequence[str]] = {
    "dtype": DTYPE_CHOICES,
    "quantize": QUANTIZE_CHOICES,
    "backend": BACKEND_CHOICES,
    "cache": CACHE_CHOICES,
    "attention_layout": ("auto", *LAYOUTS),
}


# LoadConfig fields the generic transformer alone has, with the value that leaves them off (backend
# auto resolves to torch for a network of a family's own)
TRANSFORMER_ONLY: dict[str, tuple[Any, ...]] = {
    "backend": ("torch", "auto"),
    "cache": ("auto",),
    "refresh_every": (0,),
    "compile": (False,),
    "cuda_graphs": (False,),
    "attention_layout": ("auto",),
}


def check_own_network_options(cfg: LoadConfig) -> None:
    """One-line ConfigErrors for the options a network of a family's own does not have."""
    for name, off in TRANSFORMER_ONLY.items():
        if getattr(cfg, name) not in off:
            raise ConfigError(
                f"{name} {getattr(cfg, name)!r} applies to the generic transformer only; "
                "DiffusionGemma runs its own network in torch, with its own KV cache"
            )


def load(path: str | Path, config: LoadConfig | None = None, **options: Any) -> Pipeline:
    """Load a checkpoint directory, or a Hub id ``org/name[@revision]`` (``hub.py``: the
    Hub cache first, a download only where the network is allowed), as ``config`` says, with
    ``options`` (``LoadConfig`` fields; ``dtype`` may be a ``torch.dtype``) on top. See
    ``LOAD_HELP`` for each option."""
    if isinstance(options.get("dtype"), torch.dtype):
        options["dtype"] = dtype_name(options["dtype"])
    if options.get("dtype") is None:
        options.pop("dtype", None)
    unknown = sorted(set(options) - {f.name for f in fields(LoadConfig)})
    if unknown:
        raise ConfigError(f"unknown load options {unknown}")
    cfg = replace(config or LoadConfig(), **options)
    for name, allowed in LOAD_CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{name} must be one of {tuple(allowed)}, got {getattr(cfg, name)!r}")
    path = resolve_model(path, cfg.revision)
    if architecture(path) in NETWORK_LOADERS:
        check_own_network_options(cfg)
        if cfg.quantize != "none":
            check_mode(cfg.quantize, device_of(cfg.device), "torch", True)
            net, tokenizer = quantized_network(path, cfg.quantize), load_tokenizer(path)
        else:
            net, tokenizer = load_family_network(path, DTYPES.get(cfg.dtype), cfg.device)
        return Pipeline(net, tokenizer, path, decoding_mode=cfg.decoding_mode)
    mcfg, state, tok = read_checkpoint(path)
    runtime = transformer_runtime(mcfg, state, cfg)
    return Pipeline(
        runtime.net,
        tok,
        path,
        cache=cfg.cache,
        refresh_every=cfg.refresh_every,
        decoding_mode=cfg.decoding_mode,
        runtime=runtime,
    )


def transformer_runtime(mcfg: ModelConfig, state: State, cfg: LoadConfig) -> Runtime:
    """The generic transformer's runtime as ``cfg`` asks: a dense CPU network whose weights go
    into a step graph straight from the files (``graph_format``), or the network built in torch
    with its quantization, compilation and step backend."""
    dev = device_of(cfg.device)
    dtype = DTYPES.get(cfg.dtype) or default_model_dtype(mcfg, dev)
    check_mode(cfg.quantize, dev, cfg.backend, mcfg.moe is not None)
    fmt = graph_format(cfg.quantize, cfg.backend, dtype, dev, mcfg.moe is not None)
    if fmt is not None:
        return quantized_runtime(mcfg, state, fmt, cfg.backend)
    model = build_model(mcfg, state, dtype, dev)
    runtime = Runtime(model, resolve_layout(cfg.attention_layout, model.lm_head.weight.device))
    quantize(runtime, cfg.quantize, cfg.backend)
    if cfg.cuda_graphs:
        runtime.compile_static()
    elif cfg.compile:
        runtime.compile_blocks()
    if runtime.step_backend is None:  # a quantized dense network has its step already
        attach_backend(runtime, cfg.backend)
    return runtime
