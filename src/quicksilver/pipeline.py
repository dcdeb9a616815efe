"""``quicksilver.load(path)``: a loaded model with its tokenizer and a one-call ``generate``."""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from .errors import CheckpointError, ConfigError
from .models.checkpoint import load_checkpoint
from .models.config import ModelConfig
from .models.cpu_backends import attach_backend
from .models.packing import resolve_layout
from .models.transformer import DiffusionLM
from .sampling import SamplerConfig
from .sampling.state import RowEvent
from .sampling.verify import VerifyDecoder, decoder_for
from .tokenizer import Tokenizer

Messages = list[dict[str, Any]]


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
        model: DiffusionLM,
        tokenizer: Tokenizer,
        path: str | Path | None = None,
        cache: str = "auto",
        refresh_every: int = 0,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config: ModelConfig = model.config
        self.path = Path(path) if path is not None else None
        mask_id = self.config.mask_token_id
        if tokenizer.mask_id is not None and tokenizer.mask_id != mask_id:
            raise CheckpointError(
                f"tokenizer mask id {tokenizer.mask_id} differs from config {mask_id}"
            )
        self.stop_ids = sorted(set(self.config.eos_token_ids) | set(tokenizer.stop_ids))
        pad = tokenizer.pad_id if tokenizer.pad_id is not None else self.config.eos_token_ids[0]
        self.decoder = decoder_for(
            model,
            self.stop_ids,
            pad_id=pad,
            vocab_limit=tokenizer.vocab_size,
            cache_mode=cache,
            refresh_every=refresh_every,
        )
        from .models.families import generation_defaults

        # The family's published decoding settings (+ the checkpoint's sampler_config.json): the
        # base that every request's options are applied on (CLI flags, API fields).
        self.generation_defaults: dict[str, Any] = generation_defaults(
            self.config.architecture, self.path, [f.name for f in fields(SamplerConfig)]
        )
        if isinstance(self.decoder, VerifyDecoder):  # lossless by default: the model's AR output
            self.generation_defaults.setdefault("policy", "verify")

    @property
    def runtime(self) -> str:
        """What runs the single-sequence passes (``--backend`` resolved): torch, onnx, openvino or
        openvino-bf16. Packed batches and passes no exported bucket holds run in torch."""
        step = self.model.step_backend
        return step.name if step is not None else "torch"

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
        drive = self.decoder.drive([self.decoder.new_row(ids, cfg)])  # type: ignore[list-item]  # the row is its own decoder's
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


def load(
    path: str | Path,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
    cache: str = "auto",
    refresh_every: int = 0,
    compile: bool = False,
    attention_layout: str = "auto",
    cuda_graphs: bool = False,
    quantize: str = "none",
    backend: str = "torch",
) -> Pipeline:
    """Load a checkpoint directory (never touches the network). Default dtype: ``default_dtype``
    (bfloat16 on CUDA and for CPU models of 0.5B+ parameters, float32 below).

    cache: ``auto`` (the exact block cache for block-causal models, none for bidirectional ones),
    ``none``, ``block``, or the approximate ``prefix`` / ``dual`` caches for bidirectional models,
    refreshed at every block start and every ``refresh_every`` steps (0: block starts only).
    compile: ``torch.compile`` the per-token parts of every block (for GPUs; slower on small CPUs).
    attention_layout: ``per_sequence``, ``batched`` (one attention call per layer) or ``auto``
    (batched on a GPU). cuda_graphs: static bucketed shapes + ``torch.compile(mode="reduce-overhead")``.
    backend: the runtime of single-sequence steps: ``torch`` (eager, the reference), ``onnx`` (ONNX
    Runtime), ``openvino``, ``openvino-bf16`` (bf16 arithmetic, CPUs with bf16) or ``auto`` (the
    measured winner on a CPU float32 model, else torch);
    see models/cpu_backends.py. Packed batches always run in torch.
    quantize: ``none`` or ``int8`` (dynamic int8 linear layers on the CPU; models/quantize.py)."""
    from .models.quantize import quantize_model

    model, tok = load_checkpoint(path, dtype, device)
    quantize_model(model, quantize)
    model.set_attention_layout(
        resolve_layout(attention_layout, model.model.embed_tokens.weight.device)
    )
    if cuda_graphs:
        model.compile_static()
    elif compile:
        model.compile_blocks()
    attach_backend(model, backend)
    return Pipeline(model, tok, path, cache=cache, refresh_every=refresh_every)
