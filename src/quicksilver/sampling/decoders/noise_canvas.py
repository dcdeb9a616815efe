"""DiffusionGemma's generation loop: canvases of uniform random tokens, denoised with entropy-bound
acceptance, renoising, self-conditioning, a linear temperature schedule and adaptive stopping.

Contract (token for token with ``transformers``' ``DiffusionGemmaForBlockDiffusion.generate`` given
the same random draws, tests/test_diffusion_gemma_generate.py):

- ``generate(net, prompt_ids (B, P), config, generator) -> NoiseCanvasResult``: the prompt goes
  through ``net.encode`` (writing the KV cache), then canvas after canvas of ``net.config.canvas_length``
  tokens until ``config.max_new_tokens`` are covered or every row has finished (an EOS id inside
  its latest canvas). Per canvas:

  1. the canvas starts as uniform random ids (or ``initial_canvas`` for the first one);
  2. each step (``s = N .. 1``, ``N = max_denoising_steps``) runs ``net.decode`` with the previous
     step's processed logits as self-conditioning (none on a canvas's first step), divides the
     logits by the temperature ``t_min + (t_max - t_min) * s / N`` (float32, as transformers),
     samples every position from the softmax, and accepts the sampled token at the k
     lowest-entropy positions with ``sum(entropy_1..k) - entropy_k <= entropy_bound`` (at least
     one); every other position is renoised with a fresh uniform id;
  3. a row stops denoising when its argmax canvas equals each of the last ``stability_threshold``
     argmax canvases and the mean entropy of its processed logits is below
     ``confidence_threshold``; a stopped row is frozen (canvas, argmax, self-conditioning logits)
     while the others go on, and the canvas ends when every row has stopped or after N steps;
  4. the canvas's output is its last **argmax** canvas (not the sampled one); with a
     ``pad_token_id``, tokens after a row's first EOS and every canvas after a finished row become
     pad; the output (pads included) goes through ``net.encode`` before the next canvas.

- Randomness: every draw comes from a ``CanvasNoise`` (default ``GeneratorNoise`` over an explicit
  ``torch.Generator``), consumed in transformers' order: per canvas one uniform ``(B, C)`` draw for
  the starting canvas (skipped when ``initial_canvas`` is given; transformers draws it anyway and
  discards it), then per step one categorical draw over ``(B * C, V)`` probabilities followed by
  one uniform ``(B, C)`` renoise draw. A test can substitute any ``CanvasNoise`` (pre-drawn tensors).
- Rows share one length (no padding of prompts); batched rows draw their noise together, so a
  row's tokens depend on the batch's draws (as in transformers).
- ``denoise`` is one step of 2. on a pass's logits, shared with the engine's per-request decoder
  (``noise_decoder.py``), which steps one row at a time so that its tokens never depend on a batch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from ...errors import ConfigError
from ...models.families.diffusion_gemma_net import GemmaKVCache


class NoiseCanvasNet(Protocol):
    """What the loop needs of a network (``DiffusionGemmaLM``)."""

    @property
    def config(self) -> Any: ...  # .canvas_length, .vocab_size

    def encode(self, ids: torch.Tensor, cache: GemmaKVCache) -> torch.Tensor: ...

    def decode(
        self,
        canvas: torch.Tensor,
        cache: GemmaKVCache,
        self_conditioning_logits: torch.Tensor | None = None,
        self_conditioning_mask: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class CanvasNoise(Protocol):
    """The loop's only sources of randomness."""

    def uniform(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        """Token ids (B, C) drawn uniformly from ``[0, vocab_size)``."""
        ...

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        """One id per row of ``probs`` (n, V) -> (n,)."""
        ...


@dataclass
class GeneratorNoise:
    """Draws from one explicit ``torch.Generator`` (``torch.randint`` / ``torch.multinomial``, which
    on a generator seeded like torch's global one give transformers' draws)."""

    generator: torch.Generator

    def uniform(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        dev = self.generator.device
        return torch.randint(0, vocab_size, shape, generator=self.generator, device=dev)

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)  # (n,)


@dataclass(frozen=True)
class NoiseCanvasConfig:
    """DiffusionGemma's decoding settings; defaults are transformers' (a checkpoint's
    ``generation_config.json`` overrides them, ``from_checkpoint``)."""

    max_new_tokens: int = 256
    max_denoising_steps: int = 48
    entropy_bound: float = 0.1
    t_min: float | None = 0.4  # temperature at the last step (None with t_max None: no schedule)
    t_max: float | None = 0.8  # temperature at the first step
    stability_threshold: int | None = 1  # None (or confidence None): no adaptive stopping
    confidence_threshold: float | None = 0.005
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0 or self.max_denoising_steps <= 0:
            raise ConfigError("max_new_tokens and max_denoising_steps must be positive")
        if self.entropy_bound <= 0:
            raise ConfigError(f"entropy_bound must be > 0, got {self.entropy_bound}")
        if (self.t_min is None) != (self.t_max is None):
            raise ConfigError("t_min and t_max are set together")
        if self.t_min is not None and self.t_max is not None:
            if self.t_min < 0 or self.t_max <= self.t_min:
                raise ConfigError(f"need 0 <= t_min < t_max, got {self.t_min}, {self.t_max}")
        if self.stability_threshold is not None and self.stability_threshold < 0:
            raise ConfigError(f"stability_threshold must be >= 0, got {self.stability_threshold}")
        if self.confidence_threshold is not None and self.confidence_threshold <= 0:
            raise ConfigError(f"confidence_threshold must be > 0, got {self.confidence_threshold}")

    @classmethod
    def from_generation_config(cls, gc: dict[str, Any], **overrides: Any) -> NoiseCanvasConfig:
        """From a ``generation_config.json`` dict (keys missing or null keep the defaults; the
        entropy bound sits in ``sampler_config``), then ``overrides``."""
        known = {f.name for f in fields(cls)}
        kw: dict[str, Any] = {k: gc[k] for k in known if gc.get(k) is not None}
        sampler = gc.get("sampler_config")
        if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
            kw["entropy_bound"] = sampler["entropy_bound"]
        eos = gc.get("eos_token_id")
        if eos is not None:
            kw["eos_token_ids"] = tuple(eos) if isinstance(eos, list) else (eos,)
        kw.pop("eos_token_id", None)
        out = cls(**kw)
        return replace(out, **overrides) if overrides else out

    @classmethod
    def from_checkpoint(cls, path: str | Path, **overrides: Any) -> NoiseCanvasConfig:
        """From ``path/generation_config.json`` when the checkpoint has one, else the defaults."""
        file = Path(path) / "generation_config.json"
        gc = json.loads(file.read_text()) if file.is_file() else {}
        return cls.from_generation_config(gc, **overrides)

    def temperature(self, step: int) -> torch.Tensor | None:
        """The temperature at step ``step`` (counting down N..1), a float32 scalar as transformers
        computes it, or None without a schedule."""
        if self.t_min is None or self.t_max is None:
            return None
        frac = torch.tensor(step, dtype=torch.int32) / self.max_denoising_steps  # () float32
        return self.t_min + (self.t_max - self.t_min) * frac

    @property
    def adaptive(self) -> bool:
        return self.stability_threshold is not None and self.confidence_threshold is not None


@dataclass
class NoiseCanvasResult:
    tokens: torch.Tensor  # (B, P + n * C): the prompt, then every canvas (pads included)
    prompt_len: int
    decoder_passes: torch.Tensor  # (B,) decoder passes each row took part in before it stopped
    finished: torch.Tensor  # (B,) bool: the row met an EOS (or the length budget)
    canvases: int  # canvases generated

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.tokens[:, self.prompt_len :]  # (B, n * C)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim (B, C, V) -> (B, C), computed as
    ``torch.distributions.Categorical`` does (bit-equal, so sort orders and thresholds agree).
    One row at a time, in place: two (C, V) temporaries at most, whatever B (DiffusionGemma's
    262,144-id vocabulary makes one 268 MB in float32)."""
    return torch.cat([_row_entropy(row) for row in logits.split(1)])  # (B, C)


def _row_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``entropy`` of one row (1, C, V), the same ops in the same order, two of them in place."""
    logp = logits - logits.logsumexp(-1, keepdim=True)  # (1, C, V)
    p = logp.softmax(-1)  # (1, C, V)
    return -p.mul_(logp.clamp_(min=torch.finfo(logp.dtype).min)).sum(-1)  # (1, C)


def entropy_bound_accept(ent: torch.Tensor, bound: float) -> torch.Tensor:
    """(B, C) entropies -> (B, C) bool: the k lowest-entropy positions whose entropies sum to at
    most ``bound`` more than the largest of them (the lowest is always accepted)."""
    ranked, order = ent.sort(dim=-1)  # ascending (B, C)
    within = ranked.cumsum(-1) - ranked <= bound  # (B, C), in rank order
    return torch.zeros_like(within).scatter(-1, order, within)


class StabilityConfidence:
    """Per row: the argmax canvas equals each of the last ``window`` ones and the mean entropy of
    the processed logits is below ``threshold``."""

    def __init__(self, window: int, threshold: float) -> None:
        self.window = window
        self.threshold = threshold
        self.history: list[torch.Tensor] = []  # the last `window` argmax canvases, (B, C) each

    def __call__(self, argmax: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        B = argmax.shape[0]
        stable = torch.ones(B, dtype=torch.bool, device=argmax.device)
        if self.window > 0:
            if len(self.history) < self.window:
                stable = torch.zeros_like(stable)
            for past in self.history:
                stable &= (past == argmax).all(-1)
            self.history = [*self.history, argmax][-self.window :]
        confident = entropy(logits).mean(-1) < self.threshold  # (B,)
        return stable & confident


@dataclass
class Denoised:
    """One denoising step over canvases (B, C): what ``denoise`` returns."""

    logits: torch.Tensor  # (B, C, V) processed (temperature-scaled): the next self-conditioning
    argmax: torch.Tensor  # (B, C) the argmax canvas
    sampled: torch.Tensor  # (B, C) the draw at every position (the argmax when greedy)
    entropy: torch.Tensor  # (B, C) of the processed logits (0 where ``certain``)
    accept: torch.Tensor  # (B, C) bool: entropy-bound acceptance
    fresh: torch.Tensor  # (B, C) uniform ids: what a position not kept is renoised with

    @property
    def canvas(self) -> torch.Tensor:
        """The next canvas: accepted positions keep their draw, the rest are renoised (B, C)."""
        return torch.where(self.accept, self.sampled, self.fresh)


def denoise(
    logits: torch.Tensor,
    temperature: torch.Tensor | float | None,
    entropy_bound: float,
    noise: CanvasNoise,
    greedy: bool = False,
    certain: torch.Tensor | None = None,
) -> Denoised:
    """One step on a decoder pass's logits (B, C, V): divide by ``temperature``, draw every position
    (``noise.categorical``; the argmax when ``greedy``, which skips that draw), accept by entropy
    bound, draw the renoise ids (``noise.uniform``). ``certain`` (B, C) marks positions whose token
    is already fixed: their entropy counts as 0 in the acceptance (the caller keeps their token)."""
    if temperature is not None:
        logits = logits / temperature
    B, C, V = logits.shape
    dev = logits.device
    argmax = logits.argmax(-1)  # (B, C)
    if greedy:
        sampled = argmax
    else:
        probs = logits.softmax(-1, dtype=torch.float32)  # (B, C, V): one draw, transformers' order
        sampled = noise.categorical(probs.view(-1, V)).view(B, C).to(dev)  # (B, C)
        del probs  # freed before the entropy's temporaries
    ent = entropy(logits)  # (B, C), a row at a time
    if certain is not None:
        ent = ent.masked_fill(certain, 0.0)
    accept = entropy_bound_accept(ent, entropy_bound)  # (B, C)
    fresh = noise.uniform((B, C), V).to(dev)  # (B, C)
    return Denoised(logits, argmax, sampled, ent, accept, fresh)


StepHook = Callable[[int, int, torch.Tensor], None]  # (canvas index, step, argmax canvas (B, C))


@torch.no_grad()
def generate(
    net: NoiseCanvasNet,
    prompt_ids: torch.Tensor,
    config: NoiseCanvasConfig,
    generator: torch.Generator | None = None,
    *,
    initial_canvas: torch.Tensor | None = None,
    noise: CanvasNoise | None = None,
    cache: GemmaKVCache | None = None,
    on_step: StepHook | None = None,
) -> NoiseCanvasResult:
    """Generate after ``prompt_ids`` (B, P); see the module docstring. ``cache`` (if given) holds
    what precedes the prompt and receives every encoder pass."""
    if noise is None:
        if generator is None:
            raise ConfigError("generate needs a torch.Generator or a CanvasNoise")
        noise = GeneratorNoise(generator)
    C: int = net.config.canvas_length
    V: int = net.config.vocab_size
    B, P = prompt_ids.shape
    dev = prompt_ids.device
    cache = cache if cache is not None else GemmaKVCache()
    eos = torch.tensor(config.eos_token_ids, dtype=torch.long, device=dev)
    tokens = prompt_ids
    unseen = prompt_ids  # (B, T): what the encoder has not read yet
    finished = torch.zeros(B, dtype=torch.bool, device=dev)
    passes = torch.zeros(B, dtype=torch.long, device=dev)
    n = 0
    for n in range(1, math.ceil(config.max_new_tokens / C) + 1):
        net.encode(unseen, cache)
        if n == 1 and initial_canvas is not None:
            canvas = initial_canvas.to(dev)  # (B, C)
        else:
            canvas = noise.uniform((B, C), V).to(dev)  # (B, C)
        best = canvas  # (B, C): the argmax canvas, the canvas's output
        sc: torch.Tensor | None = None  # (B, C, V) self-conditioning logits
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        stopper = (
            StabilityConfidence(config.stability_threshold or 0, config.confidence_threshold or 0.0)
            if config.adaptive
            else None
        )
        for step in range(config.max_denoising_steps, 0, -1):
            passes += ~(stopped | finished)
            d = denoise(
                net.decode(canvas, cache, sc), config.temperature(step), config.entropy_bound, noise
            )
            nxt, argmax, logits = d.canvas, d.argmax, d.logits  # (B, C), (B, C), (B, C, V)
            if stopper is not None:
                if stopped.any():  # stopped rows keep what they had
                    argmax = torch.where(stopped[:, None], best, argmax)
                    nxt = torch.where(stopped[:, None], canvas, nxt)
                    assert sc is not None
                    logits = torch.where(stopped[:, None, None], sc, logits)
                stopped |= stopper(argmax, logits)
            canvas, best, sc = nxt, argmax, logits
            if on_step is not None:
                on_step(n - 1, step, best)
            if bool(stopped.all()):
                break
        out = best.clone()  # (B, C)
        now = torch.isin(out, eos).any(-1) if eos.numel() else torch.zeros_like(finished)  # (B,)
        if n * C >= config.max_new_tokens:
            now = torch.ones_like(now)  # the length budget is spent
        if config.pad_token_id is not None and bool((finished | now).any()):
            out[finished] = config.pad_token_id  # rows finished on an earlier canvas
            hit = torch.isin(out, eos)  # (B, C)
            seen = hit.cumsum(-1)
            out[(seen > 0) & ~(hit & (seen == 1))] = config.pad_token_id  # after the first EOS
        tokens = torch.cat([tokens, out], dim=-1)  # (B, T + C)
        finished |= now
        if bool(finished.all()):
            break
        unseen = out
    return NoiseCanvasResult(tokens, P, passes, finished, n)
