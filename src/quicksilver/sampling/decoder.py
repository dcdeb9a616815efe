"""The fast parallel-refinement decoder.

Each request is a ``Row``: a prompt and a canvas of ``max_new_tokens`` masked positions after it.
One ``step`` runs one forward pass over all rows together and lets every row commit tokens in its
current semi-autoregressive block by its policy (a fixed count per step, or every position whose
confidence reaches a threshold), optionally re-mask committed tokens whose confidence has fallen
(revision), and stop as soon as a stop token is committed with everything before it (honest
length: positions after it are dropped from the input and never returned).

Rows are independent: their own sampler settings, seeded generator, canvas length and block
position, and the attention mask keeps them apart, so a row's output does not depend on what else
is in the batch. Rows may join and leave between steps (``step`` takes any list of live rows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..errors import ConfigError
from ..models.kvcache import KVCache
from ..models.transformer import DiffusionLM, Segment
from .config import SamplerConfig
from .noise import sample_tokens
from .policies import POLICIES


class Constraint(Protocol):
    """Restricts what a row may commit (structured output, tool arguments).

    ``mask_logits`` gets the window's logits (hi - lo, V) and returns them with forbidden tokens at
    -inf; ``allow`` is asked before each commit, in score order, with the canvas as committed so
    far. At the leftmost masked position some token must be allowed, so decoding always progresses.
    """

    def mask_logits(self, row: Row, lo: int, logits: torch.Tensor) -> torch.Tensor: ...

    def allow(self, row: Row, pos: int, token: int) -> bool: ...


@dataclass
class RowEvent:
    """What one step did to one row. Positions are canvas indices (0 = first generated token)."""

    row: Row
    step: int
    committed: list[tuple[int, int]]  # (position, token) committed this step
    remasked: list[int]  # positions re-masked by revision this step
    stable: int  # canvas[:stable] is final: committed and never to change
    end: int  # output length bound: positions >= end are gone (stop token or canvas end)
    done: bool
    finish_reason: str | None = None  # "stop" (stop token) | "length" (canvas full)
    canvas: list[int] | None = None  # canvas[:end] (mask id where masked) when record_canvas


@dataclass
class DecodeResult:
    tokens: list[int]  # the output, stop token excluded
    finish_reason: str
    nfe: int  # forward passes this row took part in
    steps: int
    revisions: int
    seconds: float = 0.0

    @property
    def tpf(self) -> float:
        return len(self.tokens) / max(self.nfe, 1)


@dataclass
class Row:
    """One sequence being decoded."""

    prompt: torch.Tensor  # (P,) long
    cfg: SamplerConfig
    mask_id: int
    stop_ids: frozenset[int]
    block_length: int
    aligned: bool  # blocks at absolute multiples of block_length (block-causal models)
    model_block: int | None  # the model's attention block size if block_causal, else None
    vocab_limit: int | None = None
    cache: KVCache | None = None
    cache_mode: str = (
        "none"  # block (exact, block-causal) | prefix | dual (approximate, bidirectional) | none
    )
    refresh_every: int = (
        0  # approximate caches: full recompute every k steps within a block (0: block starts only)
    )
    generator: torch.Generator | None = None
    prefill: dict[int, int] | None = (
        None  # canvas position -> token fixed before decoding (skeletons)
    )
    suffix: torch.Tensor | None = (
        None  # (S,) tokens after the canvas (infilling, bidirectional models)
    )
    constraint: Constraint | None = None
    canvas: torch.Tensor = field(init=False)  # (N,) long
    committed: torch.Tensor = field(init=False)  # (N,) bool
    revisions: torch.Tensor = field(init=False)  # (N,) int
    tag: object = None  # owner's handle (the engine's request)

    def __post_init__(self) -> None:
        n = self.cfg.max_new_tokens
        self.P = int(self.prompt.shape[0])
        self.N = n
        self.canvas = torch.full((n,), self.mask_id, dtype=torch.long, device=self.prompt.device)
        self.committed = torch.zeros(n, dtype=torch.bool, device=self.prompt.device)
        self.revisions = torch.zeros(n, dtype=torch.int32, device=self.prompt.device)
        self.fixed = torch.zeros(
            n, dtype=torch.bool, device=self.prompt.device
        )  # prefilled: never revised
        for pos, tok in (self.prefill or {}).items():
            self.canvas[pos], self.committed[pos], self.fixed[pos] = tok, True, True
        self.S = 0 if self.suffix is None else int(self.suffix.shape[0])
        self.stale = True  # approximate caches: the next pass must recompute everything
        self.end = n  # canvas[:end] is live (stop token at end-1 once found)
        self.stop_pos: int | None = None
        self.offset = self.P % self.block_length if self.aligned else 0
        self.n_blocks = math.ceil((n + self.offset) / self.block_length)
        self.block = 0
        self.verified_block = -1
        steps = self.cfg.steps
        if steps is None and POLICIES[self.cfg.policy].rule == "schedule":
            steps = n  # one token per step unless told otherwise
        self.steps_per_block = None if steps is None else max(1, math.ceil(steps / self.n_blocks))
        self.block_steps = 0
        self.nfe = 0
        self.steps = 0
        self.n_revisions = 0
        self.done = False
        self.finish_reason: str | None = None
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self._advance()

    # ---- geometry -----------------------------------------------------------------------------
    def block_bounds(self, b: int) -> tuple[int, int]:
        lo = max(0, b * self.block_length - self.offset)
        hi = min(self.end, (b + 1) * self.block_length - self.offset)
        return lo, max(lo, hi)

    def window(self) -> tuple[int, int]:
        return self.block_bounds(self.block)

    def input_len(self) -> int:
        """Tokens of prompt + canvas this row feeds to the next forward pass."""
        if self.model_block is None:  # bidirectional/causal: the whole live canvas (+ suffix)
            return self.P + self.end + self.S
        _, hi = self.window()  # block-causal: nothing after the model block holding the window
        abs_hi = self.P + hi
        return min(self.P + self.end, math.ceil(abs_hi / self.model_block) * self.model_block)

    def sequence(self, length: int) -> torch.Tensor:
        if self.S:
            return torch.cat((self.prompt, self.canvas[: self.end], self.suffix))  # (P + end + S,)
        return torch.cat((self.prompt, self.canvas[: length - self.P]))  # (length,)

    def segment(self) -> Segment:
        """This row's share of the next forward pass: the tokens after its cache, which of them to
        append to the cache (complete model blocks before the current window), which logits to return."""
        n = self.input_len()
        lo, hi = self.window()
        seq = self.sequence(n)  # (n,)
        if self.cache is not None and self.cache_mode in ("prefix", "dual"):
            return self._approx_segment(seq, lo, hi)
        start, append = 0, 0
        if self.cache is not None:
            assert self.model_block is not None
            start = self.cache.length
            freeze = (
                (self.P + lo) // self.model_block * self.model_block
            )  # start of the window's model block
            append = max(0, freeze - start)
        ids = seq[start:]
        positions = torch.arange(start, start + int(ids.shape[0]), device=ids.device)
        return Segment(ids, positions, self.P + lo - start, self.P + hi - start, self.cache, append)

    def _approx_segment(self, seq: torch.Tensor, lo: int, hi: int) -> Segment:
        """Fast-dLLM-style caches for bidirectional models: at a block start (or every
        ``refresh_every`` steps) one full pass refreshes the cached keys/values; in between, the
        prefix cache recomputes the block and everything after it, the dual cache only the block."""
        assert self.cache is not None
        n = int(seq.shape[0])
        due = self.refresh_every > 0 and self.block_steps % self.refresh_every == 0
        if self.stale or self.block_steps == 0 or due:
            self.cache.truncate(0)
            self.stale = False
            keep = self.P + lo if self.cache_mode == "prefix" else n
            return Segment(
                seq, torch.arange(n, device=seq.device), self.P + lo, self.P + hi, self.cache, keep
            )
        if self.cache_mode == "prefix":
            start = self.cache.length
            return Segment(
                seq[start:],
                torch.arange(start, n, device=seq.device),
                self.P + lo - start,
                self.P + hi - start,
                self.cache,
                0,
            )
        a, b = self.P + lo, self.P + hi
        return Segment(
            seq[a:b], torch.arange(a, b, device=seq.device), 0, b - a, self.cache, 0, overwrite=True
        )

    @property
    def revising(self) -> bool:
        return self.cfg.revise_threshold is not None and self.cfg.max_revisions > 0

    def _advance(self) -> None:
        """Move to the first block with a masked position; finish if there is none.

        With revision on, a filled block gets one more pass that checks its tokens before the
        decoder moves on (it moves on once a check re-masks nothing)."""
        while True:
            lo, hi = self.window()
            if lo >= self.end:
                self._finish()
                return
            if not bool(self.committed[lo:hi].all()):
                return
            if self.revising and self.verified_block != self.block:
                return
            self.block += 1
            self.block_steps = 0

    def _finish(self) -> None:
        self.done = True
        self.finish_reason = "stop" if self.stop_pos is not None else "length"
        self.seconds = time.perf_counter() - self.t0

    def stable(self) -> int:
        if self.done:
            return self.stop_pos if self.stop_pos is not None else self.end
        if self.revising:
            return self.window()[0]
        masked = (~self.committed[: self.end]).nonzero()
        return int(masked[0]) if masked.numel() else self.end

    # ---- one refinement step ------------------------------------------------------------------
    def update(self, logits: torch.Tensor, step: int) -> RowEvent:
        """Apply one step given the logits (hi - lo, V) of the current window."""
        cfg = self.cfg
        policy = POLICIES[cfg.policy]
        lo, hi = self.window()
        self.nfe += 1
        self.steps += 1
        self.block_steps += 1
        logits = logits.float()
        logits[:, self.mask_id] = float("-inf")  # the mask is never a prediction
        if self.vocab_limit is not None:
            logits[:, self.vocab_limit :] = float("-inf")
        if self.constraint is not None:
            logits = self.constraint.mask_logits(self, lo, logits)
        probs = logits.softmax(-1)  # (n, V)
        x0 = sample_tokens(logits, cfg.temperature, cfg.top_p, self.generator)  # (n,)
        masked = ~self.committed[lo:hi]  # (n,)

        remasked: list[int] = []
        if cfg.revise_threshold is not None and cfg.max_revisions > 0:
            cur = self.canvas[lo:hi]
            p_cur = probs.gather(-1, cur.clamp_max(probs.shape[-1] - 1)[:, None]).squeeze(-1)
            is_stop = torch.tensor(
                [int(t) in self.stop_ids for t in cur.tolist()], dtype=torch.bool
            )
            bad = (
                (~masked)
                & (p_cur < cfg.revise_threshold)
                & (self.revisions[lo:hi] < cfg.max_revisions)
                & ~is_stop
                & ~self.fixed[lo:hi]
            )
            if bool(bad.any()):
                idx = bad.nonzero().squeeze(-1) + lo
                self.canvas[idx] = self.mask_id
                self.committed[idx] = False
                self.revisions[idx] += 1
                self.n_revisions += int(idx.numel())
                remasked = idx.tolist()

        n_masked = int(masked.sum())
        if n_masked == 0:  # a check pass over a filled block (revision)
            if not remasked:
                self.verified_block = self.block
            self._advance()
            return self._event(step, [], remasked)
        noise = None
        if policy.needs_noise:
            noise = torch.rand(hi - lo, generator=self.generator, device=logits.device)
        score = policy.score(probs, x0, noise).float().masked_fill(~masked, float("-inf"))  # (n,)
        if self.steps_per_block is not None:
            left = max(1, self.steps_per_block - self.block_steps + 1)
            k = math.ceil(n_masked / left)
        else:
            k = 1
        k = min(max(k, 1), n_masked)
        order = score.argsort(descending=True, stable=True)
        take = torch.zeros_like(masked)
        take[order[:k]] = True
        if policy.rule == "threshold":
            take |= score >= cfg.threshold
        take &= masked
        if self.constraint is None:
            idx = take.nonzero().squeeze(-1)
            toks = x0[idx]
            self.canvas[idx + lo] = toks
            self.committed[idx + lo] = True
            committed = list(zip((idx + lo).tolist(), toks.tolist()))
        else:
            committed = self._commit_constrained(lo, order, take, x0, logits, masked)

        if cfg.stop_at_eos and committed:
            stops = [p for p, t in committed if t in self.stop_ids]
            if stops and (self.stop_pos is None or min(stops) < self.stop_pos):
                self.stop_pos = min(stops)
                self.end = self.stop_pos + 1
                self.stale = True
                self.canvas[self.end :] = self.mask_id
                self.committed[self.end :] = False
                committed = [(p, t) for p, t in committed if p < self.end]
        self._advance()
        return self._event(step, committed, remasked)

    def _event(self, step: int, committed: list[tuple[int, int]], remasked: list[int]) -> RowEvent:
        return RowEvent(
            row=self,
            step=step,
            committed=committed,
            remasked=remasked,
            stable=self.stable(),
            end=self.output_end(),
            done=self.done,
            finish_reason=self.finish_reason,
            canvas=self.canvas[: self.end].tolist() if self.cfg.record_canvas else None,
        )

    def _commit_constrained(
        self,
        lo: int,
        order: torch.Tensor,
        take: torch.Tensor,
        x0: torch.Tensor,
        logits: torch.Tensor,
        masked: torch.Tensor,
    ) -> list[tuple[int, int]]:
        """Commit the chosen positions in score order, each only if the constraint allows it."""
        assert self.constraint is not None
        committed: list[tuple[int, int]] = []
        for i in order.tolist():
            if not bool(take[i]):
                continue
            pos, tok = lo + i, int(x0[i])
            if self.constraint.allow(self, pos, tok):
                self.canvas[pos], self.committed[pos] = tok, True
                committed.append((pos, tok))
        now = ~self.committed[
            lo : lo + masked.shape[0]
        ]  # masked now (revision may have opened holes)
        if committed or not bool(now.any()):
            return committed
        i = int(
            now.nonzero()[0]
        )  # nothing allowed: the leftmost masked position, best allowed token
        for tok in logits[i].argsort(descending=True).tolist():
            if logits[i, tok] == float("-inf"):
                break
            if self.constraint.allow(self, lo + i, tok):
                self.canvas[lo + i], self.committed[lo + i] = tok, True
                return [(lo + i, tok)]
        raise RuntimeError(f"constraint allows no token at canvas position {lo + i}")

    def output_end(self) -> int:
        return self.stop_pos if self.stop_pos is not None else self.end

    def result(self) -> DecodeResult:
        out = self.canvas[: self.output_end()].tolist()
        return DecodeResult(
            out,
            self.finish_reason or "length",
            self.nfe,
            self.steps,
            self.n_revisions,
            self.seconds,
        )


CACHE_MODES = ("auto", "none", "block", "prefix", "dual")


class Decoder:
    """Builds rows for a model and runs batched refinement steps over them."""

    def __init__(
        self,
        model: DiffusionLM,
        mask_id: int,
        stop_ids: Sequence[int],
        pad_id: int = 0,
        vocab_limit: int | None = None,
        use_cache: bool = True,
        cache_mode: str = "auto",
        refresh_every: int = 0,
    ) -> None:
        self.model = model
        self.use_cache = use_cache  # False: no cache at all (the uncached reference path)
        if cache_mode not in CACHE_MODES:
            raise ConfigError(f"cache mode must be one of {CACHE_MODES}, got {cache_mode!r}")
        self.cache_mode = cache_mode
        self.refresh_every = refresh_every
        self.vocab_limit = (
            vocab_limit  # ids >= this are padding rows of the embedding: never sampled
        )
        self.mask_id = mask_id
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.pad_id = pad_id
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def resolve_cache_mode(self) -> str:
        """auto: the exact block cache for block-causal models, no cache for the others."""
        att = self.model.config.attention
        if not self.use_cache or att == "causal":
            return "none"
        mode = self.cache_mode
        if mode == "auto":
            mode = "block" if att == "block_causal" else "none"
        if mode == "block" and att != "block_causal":
            raise ConfigError(
                "the exact block cache needs a block-causal model; use prefix or dual"
            )
        if mode in ("prefix", "dual") and att != "bidirectional":
            mode = "block"  # block-causal models have an exact cache: no need to approximate
        return mode

    def new_row(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        tag: object = None,
        prefill: dict[int, int] | None = None,
        suffix: Sequence[int] | None = None,
        constraint: Constraint | None = None,
        extra_stops: Sequence[int] | None = None,
    ) -> Row:
        mcfg = self.model.config
        cfg.validate(mcfg.max_seq_len, len(prompt_ids) + len(suffix or ()))
        if suffix and mcfg.attention != "bidirectional":
            raise ConfigError(
                "a suffix after the canvas needs a bidirectional model; "
                "use the fill-in-the-middle prompt format for this one"
            )
        if prefill and any(not 0 <= p < cfg.max_new_tokens for p in prefill):
            raise ConfigError("prefilled positions must lie inside the canvas")
        block_causal = mcfg.attention == "block_causal"
        bl = cfg.block_length or (mcfg.block_size if block_causal else min(32, cfg.max_new_tokens))
        gen = None
        if cfg.temperature > 0 or POLICIES[cfg.policy].needs_noise:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(
                cfg.seed if cfg.seed is not None else int(torch.randint(0, 2**62, ()).item())
            )
        mode = self.resolve_cache_mode()
        prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=self.device)
        sfx = torch.tensor(list(suffix), dtype=torch.long, device=self.device) if suffix else None
        stops = (
            self.stop_ids | frozenset(int(t) for t in extra_stops) if extra_stops else self.stop_ids
        )
        return Row(
            prompt,
            cfg,
            self.mask_id,
            stops,
            bl,
            aligned=block_causal,
            model_block=mcfg.block_size if block_causal else None,
            generator=gen,
            tag=tag,
            prefill=prefill,
            suffix=sfx,
            constraint=constraint,
            vocab_limit=self.vocab_limit,
            cache=KVCache() if mode != "none" else None,
            cache_mode=mode,
            refresh_every=self.refresh_every,
        )

    @torch.no_grad()
    def step(self, rows: Sequence[Row]) -> list[RowEvent]:
        """One forward pass over the live rows; every row advances one refinement step."""
        rows = [r for r in rows if not r.done]
        if not rows:
            return []
        self.step_count += 1
        logits = self.model.forward_segments([r.segment() for r in rows])
        return [r.update(lg, self.step_count) for r, lg in zip(rows, logits)]  # lg: (hi-lo, V)

    def run(
        self, prompts: Sequence[Sequence[int]], cfgs: SamplerConfig | Sequence[SamplerConfig]
    ) -> Generator[list[RowEvent], None, list[DecodeResult]]:
        """Decode a fixed batch to the end, yielding each step's events; returns one result per prompt."""
        if isinstance(cfgs, SamplerConfig):
            cfgs = [cfgs] * len(prompts)
        rows = [self.new_row(p, c) for p, c in zip(prompts, cfgs)]
        while any(not r.done for r in rows):
            yield self.step(rows)
        return [r.result() for r in rows]

    def generate(
        self, prompts: Sequence[Sequence[int]], cfgs: SamplerConfig | Sequence[SamplerConfig]
    ) -> list[DecodeResult]:
        gen = self.run(prompts, cfgs)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value
