"""DiffusionGemma's canvases of uniform noise through the one decoder contract: ``NoiseCanvasDecoder``.

Contract:

- One row (``NoiseRow``) per request over a ``DiffusionGemmaLM``, with its own ``GemmaKVCache``, its
  own seeded ``torch.Generator`` (``noise.request_generator``) and its own ``NoiseCanvasConfig``: the
  checkpoint's (``generation_config.json``) with the request's ``max_new_tokens``, and ``steps`` as
  ``max_denoising_steps`` when given. ``step(rows)`` takes the live rows one after another: the
  encoder pass over what the row has not read yet (its prompt, then each finished canvas), then one
  decoder pass over its canvas. A row's tokens never depend on the batch (packing rows into one
  pass is a later optimisation). NFE counts decoder passes.
- Canvases: the request's ``max_new_tokens`` positions are decoded ``canvas_length`` at a time. Each
  canvas is a whole ``canvas_length`` (cut only where the context ends); the positions of the last
  one past ``max_new_tokens`` are free for an unconstrained row (denoised, then cut from the output:
  with ``max_new_tokens`` a multiple of the canvas a row equals ``noise_canvas.generate`` on a batch
  of one, draw for draw) and pad for a constrained one.
- One step is ``noise_canvas.denoise``: the temperature schedule, a draw at every position,
  entropy-bound acceptance, renoising with uniform ids, the processed logits as the next step's
  self-conditioning; a canvas ends when stable and confident, or after its ``max_denoising_steps``.
- Temperature ``T`` scales the checkpoint's schedule: the step temperature is ``T * (t_min + (t_max
  - t_min) * s / N)``, so 1 (the family's default) is the published schedule. ``T = 0`` is greedy:
  every position takes its argmax instead of a draw, the schedule stays the checkpoint's for the
  entropy, acceptance and stopping, and the generator (starting canvases, renoise ids) is seeded
  with the request's ``seed`` or 0, so the output depends on the prompt and seed alone.
- Tokens are committed when a canvas ends: its argmax canvas (prefilled positions keep their
  tokens), cut at the first stop token, which ends the row (finish_reason ``stop``; ``length`` once
  the canvases cover ``max_new_tokens``). Each event carries the tokens committed by its step; with
  ``cfg.record_canvas`` its ``canvas`` is the output so far followed by the current argmax canvas
  (the live ``diffusing`` view: a noise canvas has no masked position).
- Settings of mask canvases (policy, threshold, block_length, window, revision, editing) and
  top_p/top_k are ignored; policy ``verify`` and a suffix (infilling) are refused.

Constraints (structured output, tool calls, banned tokens, logprobs: any row with a ``Constraint``)
decode in commit mode, so every reply parses and validates:

- skeleton positions (the request's ``prefill``) are placed on each canvas that covers them and are
  never renoised; like every committed position, their entropy counts as 0 in the acceptance;
- the pass's logits over the canvas's positions go through ``constraint.mask_logits`` before the
  temperature, so every position is drawn from the constrained distribution;
- the accepted, uncommitted positions are committed one by one in entropy order, each only if
  ``constraint.allow`` agrees (``hooks.commit_constrained``: when none is allowed, the leftmost
  uncommitted position takes its most probable allowed token), and stay fixed from then on;
- every other position (not accepted, or refused by the constraint) is renoised with a uniform id,
  as an unconstrained canvas is;
- a canvas ends once all its positions are committed (or everything before a committed stop token);
  when it is stable and confident or its step budget is spent first, its remaining positions are
  filled left to right with the most probable allowed token of the last pass (no extra pass).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from ...errors import ConfigError
from ...models.families.diffusion_gemma_net import DiffusionGemmaLM, GemmaKVCache
from ...models.kvcache import KVCache
from ..core.config import SamplerConfig
from ..core.hooks import Constraint, commit_constrained
from ..core.noise import request_generator
from ..core.policies import POLICIES
from ..core.state import DecodeResult, RowEvent
from .noise_canvas import Denoised, GeneratorNoise, NoiseCanvasConfig, StabilityConfidence, denoise
from .row_decoder import RowDecoder, row_stops


@dataclass
class NoiseRow:
    """One request on noise canvases: settings, its cache and generator, the canvas in progress,
    and the request's positions as constraints read them (``canvas``/``committed``, (N,) each)."""

    prompt_ids: list[int]
    cfg: SamplerConfig
    config: NoiseCanvasConfig  # this row's: max_new_tokens, max_denoising_steps
    canvas_length: int
    max_context: int
    stop_ids: frozenset[int]
    pad_id: int
    noise: GeneratorNoise
    device: torch.device
    prefill: dict[int, int] = field(default_factory=dict)
    constraint: Constraint | None = None
    tag: object = None
    canvas: torch.Tensor = field(init=False)  # (N,) long: prefilled, then committed tokens
    committed: torch.Tensor = field(init=False)  # (N,) bool

    cache_mode = "none"  # the row keeps its own GemmaKVCache (``kv``), not the engine's pool

    def __post_init__(self) -> None:
        self.P, self.N = len(self.prompt_ids), self.cfg.max_new_tokens
        self.canvas = torch.full((self.N,), self.pad_id, dtype=torch.long, device=self.device)
        self.committed = torch.zeros(self.N, dtype=torch.bool, device=self.device)
        for pos, tok in self.prefill.items():
            self.canvas[pos], self.committed[pos] = tok, True
        self.kv = GemmaKVCache()
        self.unseen = list(self.prompt_ids)  # what the encoder has not read yet
        self.host_tokens: list[int] = []  # the output: final tokens, the stop token excluded
        self.lo = 0  # the current canvas starts at this request position
        self.noisy: torch.Tensor | None = None  # (1, Cl) the canvas being denoised; None: between
        self.sc: torch.Tensor | None = None  # (1, Cl, V) self-conditioning logits
        self.best: torch.Tensor | None = None  # (Cl,) the argmax canvas
        self.stopper: StabilityConfidence | None = None
        self.left = 0  # denoising steps left on this canvas (the schedule's s)
        self.nfe = 0
        self.done = False
        self.finish_reason: str | None = None
        self.t0 = time.perf_counter()
        self.seconds = 0.0

    # ---- what the engine reads ------------------------------------------------------------------
    @property
    def cache(self) -> KVCache | None:
        return None

    def width(self) -> int:
        """Positions of the current canvas: ``canvas_length``, cut where the context ends."""
        return min(self.canvas_length, self.max_context - self.P - self.lo)

    def block_span(self) -> tuple[int, int]:
        """Request positions [lo, hi) the current canvas covers (the rest of it lies past N)."""
        return self.lo, min(self.lo + self.canvas_length, self.N)

    def input_len(self) -> int:
        return len(self.unseen) + self.width()

    def host_sequence(self) -> list[int]:
        return self.prompt_ids + self.host_tokens

    def exact_prefix(self) -> int:
        return 0  # no prefix cache over the engine's pool

    def take_prefix(self, n: int) -> None:
        pass

    def result(self) -> DecodeResult:
        return DecodeResult(
            tokens=list(self.host_tokens),
            finish_reason=self.finish_reason or "length",
            nfe=self.nfe,
            steps=self.nfe,
            revisions=0,
            seconds=self.seconds,
        )

    # ---- the canvas -----------------------------------------------------------------------------
    def temperature(self) -> torch.Tensor | float | None:
        """This step's temperature: the schedule at ``left``, scaled by the request's (not at 0)."""
        t, scale = self.config.temperature(self.left), float(self.cfg.temperature)
        if scale in (0.0, 1.0):
            return t
        return scale if t is None else t * scale

    def fixed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Which positions of the current canvas hold a fixed token (1, Cl) bool, and those tokens
        (1, Cl): committed (prefilled) ones, and a constrained row's pad past N."""
        lo, hi = self.block_span()
        Cl = self.width()
        keep = torch.zeros(1, Cl, dtype=torch.bool, device=self.device)
        held = torch.full((1, Cl), self.pad_id, dtype=torch.long, device=self.device)
        keep[0, : hi - lo], held[0, : hi - lo] = self.committed[lo:hi], self.canvas[lo:hi]
        if self.constraint is not None:
            keep[0, hi - lo :] = True
        return keep, held

    def start_canvas(self, vocab_size: int) -> None:
        """Uniform noise over the next canvas, fixed tokens placed (one draw of the generator)."""
        noisy = self.noise.uniform((1, self.width()), vocab_size).to(self.device)  # (1, Cl)
        keep, held = self.fixed()
        self.noisy, self.sc, self.best = torch.where(keep, held, noisy), None, None
        self.left = self.config.max_denoising_steps
        c = self.config
        self.stopper = (
            StabilityConfidence(c.stability_threshold or 0, c.confidence_threshold or 0.0)
            if c.adaptive
            else None
        )

    def commit_output(self) -> list[tuple[int, int]]:
        """The canvas's argmax output onto the request's positions (unconstrained rows)."""
        assert self.best is not None
        lo, hi = self.block_span()
        free = (~self.committed[lo:hi]).tolist()
        out = self.best[: hi - lo].tolist()
        self.canvas[lo:hi] = self.best[: hi - lo]
        self.committed[lo:hi] = True
        return [(lo + i, t) for i, t in enumerate(out) if free[i]]

    def take_final(self) -> None:
        """Extend the output over committed positions; a stop token ends the row, so does N."""
        committed, tokens = self.committed.tolist(), self.canvas.tolist()
        while len(self.host_tokens) < self.N and committed[len(self.host_tokens)]:
            t = tokens[len(self.host_tokens)]
            if t in self.stop_ids:
                self.finish("stop")
                return
            self.host_tokens.append(t)
        if len(self.host_tokens) >= self.N:
            self.finish("length")

    def next_canvas(self, tokens: torch.Tensor) -> None:
        """After a canvas ends as ``tokens`` (Cl,): the encoder reads them before the next one."""
        self.unseen, self.lo = tokens.tolist(), self.lo + self.canvas_length
        self.noisy = self.best = None

    def finish(self, reason: str) -> None:
        self.done, self.finish_reason = True, reason
        self.seconds = time.perf_counter() - self.t0
        self.noisy = self.sc = None

    def cut_at_stop(self, committed: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """This step's commits up to the stop token that ended the row (it included)."""
        if self.finish_reason != "stop":
            return committed
        end = len(self.host_tokens)
        return [(p, t) for p, t in committed if p <= end]

    def event(self, step: int, committed: list[tuple[int, int]]) -> RowEvent:
        return RowEvent(
            row=self,
            step=step,
            committed=self.cut_at_stop(committed),
            remasked=[],
            stable=len(self.host_tokens),
            end=len(self.host_tokens) if self.done else self.N,
            done=self.done,
            finish_reason=self.finish_reason,
            canvas=self.view() if self.cfg.record_canvas else None,
        )

    def view(self) -> list[int]:
        """The output so far, then the rest of the current argmax canvas (the live view)."""
        if self.done or self.best is None:
            return list(self.host_tokens)
        lo, hi = self.block_span()
        return self.host_tokens + self.best[len(self.host_tokens) - lo : hi - lo].tolist()


def commit_accepted(row: NoiseRow, d: Denoised, logits: torch.Tensor) -> list[tuple[int, int]]:
    """Commit mode: the accepted, uncommitted positions of the canvas in entropy order, each as the
    constraint allows (at least one position per pass); ``logits`` (n, V) the masked window."""
    n = logits.shape[0]
    take = (d.accept[0, :n] & ~row.committed[row.lo : row.lo + n]).tolist()
    order = d.entropy[0, :n].argsort(stable=True)  # (n,) lowest entropy first
    return commit_constrained(row, order, take, d.sampled[0, :n].tolist(), logits)


def fill_greedy(row: NoiseRow, logits: torch.Tensor) -> list[tuple[int, int]]:
    """Commit mode, at a canvas's end: its uncommitted positions left to right, each the most probable
    token the constraint allows under the last pass's masked logits (n, V); stops at a stop token."""
    lo, hi = row.block_span()
    nothing, none = torch.empty(0, dtype=torch.long), [False] * (hi - lo)
    out: list[tuple[int, int]] = []
    while not bool(row.committed[lo:hi].all()):
        got = commit_constrained(row, nothing, none, [], logits)  # the leftmost, best allowed
        out += got
        if any(t in row.stop_ids for _, t in got):
            break
    return out


def settle(row: NoiseRow, window: torch.Tensor | None, ends: bool) -> list[tuple[int, int]]:
    """After a pass: the output so far, the row's end, the next canvas. An unconstrained canvas
    that ``ends`` commits its argmax canvas; a constrained one (``window`` (n, V) its masked logits)
    fills what is left greedily, and ends whenever every position is committed."""
    hi = row.block_span()[1]
    if window is not None:
        committed = fill_greedy(row, window) if ends else []
        row.take_final()
        if not row.done and len(row.host_tokens) >= hi:  # every position committed
            row.next_canvas(row.fixed()[1][0])
        return committed
    if not ends:
        return []
    assert row.best is not None
    best, committed = row.best, row.commit_output()
    row.take_final()
    if not row.done:
        row.next_canvas(best)
    return committed


class NoiseCanvasDecoder(RowDecoder[NoiseRow]):
    """Rows of a ``DiffusionGemmaLM``, each denoising its own canvases (see the module docstring)."""

    model: DiffusionGemmaLM

    def __init__(
        self,
        model: DiffusionGemmaLM,
        base: NoiseCanvasConfig,
        stop_ids: Sequence[int],
        pad_id: int,
    ) -> None:
        self.model = model
        self.runtime = model  # its network runs itself, with its own KV cache
        self.base = base
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.pad_id = pad_id
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def new_row(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        tag: object = None,
        prefill: dict[int, int] | None = None,
        suffix: Sequence[int] | None = None,
        constraint: Constraint | None = None,
        extra_stops: Sequence[int] | None = None,
    ) -> NoiseRow:
        self.check_request(prompt_ids, cfg, prefill, len(suffix or ()))
        if suffix:
            raise ConfigError(
                "DiffusionGemma writes after its prompt only; infilling needs a bidirectional "
                "mask model"
            )
        if POLICIES[cfg.policy].rule == "verify":
            raise ConfigError(
                "policy verify needs a causal model that drafts; DiffusionGemma denoises canvases"
            )
        config = replace(
            self.base,
            max_new_tokens=cfg.max_new_tokens,
            max_denoising_steps=cfg.steps or self.base.max_denoising_steps,
        )
        seed = cfg.seed if cfg.seed is not None or cfg.temperature > 0 else 0
        stops = row_stops(self.stop_ids, extra_stops, cfg.stop_at_eos)
        mcfg = self.model.config
        return NoiseRow(
            prompt_ids=list(prompt_ids),
            cfg=cfg,
            config=config,
            canvas_length=mcfg.canvas_length,
            max_context=mcfg.max_seq_len,
            stop_ids=stops,
            pad_id=self.pad_id,
            noise=GeneratorNoise(request_generator(seed, self.device)),
            device=self.device,
            prefill=dict(prefill or {}),
            constraint=constraint,
            tag=tag,
        )

    @torch.no_grad()
    def step(self, rows: Sequence[NoiseRow]) -> list[RowEvent]:
        """One decoder pass per live row (and the encoder pass it needs first), row after row."""
        rows = [r for r in rows if not r.done]
        if not rows:
            return []
        self.step_count += 1
        return [self.advance(r) for r in rows]

    def advance(self, row: NoiseRow) -> RowEvent:
        """One denoising step of ``row``'s canvas; at the canvas's end, its commits."""
        net = self.model
        if row.unseen:
            ids = torch.tensor(row.unseen, dtype=torch.long, device=row.device)[None]  # (1, T)
            net.encode(ids, row.kv)
            row.unseen = []
        if row.noisy is None:
            row.start_canvas(net.config.vocab_size)
        assert row.noisy is not None
        keep, held = row.fixed()
        logits = net.decode(row.noisy, row.kv, row.sc)  # (1, Cl, V)
        row.nfe += 1
        lo, hi = row.block_span()
        window: torch.Tensor | None = None  # (hi - lo, V) the constrained positions' masked logits
        if row.constraint is not None:
            window = row.constraint.mask_logits(row, lo, logits[0, : hi - lo].clone())
            logits[0, : hi - lo] = window
        greedy = row.cfg.temperature <= 0
        d = denoise(logits, row.temperature(), row.config.entropy_bound, row.noise, greedy, keep)
        committed: list[tuple[int, int]] = []
        if window is not None:
            committed = commit_accepted(row, d, window)
            keep, held = row.fixed()
            nxt = torch.where(keep, held, d.fresh)  # (1, Cl): committed stay, the rest renoised
        else:
            nxt = torch.where(keep, held, d.canvas)  # (1, Cl)
        best = torch.where(keep, held, d.argmax)  # (1, Cl)
        row.left -= 1
        stop = row.stopper is not None and bool(row.stopper(best, d.logits)[0])
        row.noisy, row.sc, row.best = nxt, d.logits, best[0]
        return row.event(self.step_count, committed + settle(row, window, stop or row.left == 0))
