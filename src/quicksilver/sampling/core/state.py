"""The per-request decoding state: a plain record, its block geometry, and what a step did to it.

A ``Row`` is one sequence being decoded: a prompt and a canvas of ``max_new_tokens`` positions
after it. The canvas lives twice: on the device (``canvas``/``committed``, what the next forward pass
reads and what constraints inspect) and on the host (``host_tokens``/``host_committed``, kept in
step by the one event transfer per step), so every decision the host makes between steps (which
block, how many tokens to commit, when to stop) costs no device read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ...models.kvcache import KVCache
from ...runtime.segment import Segment
from .caches import CACHE_MODES
from .config import SamplerConfig
from .policies import POLICIES

if TYPE_CHECKING:
    from ..decoders.row_decoder import RowLike
    from .hooks import Constraint


@dataclass
class RowEvent:
    """What one step did to one row. Positions are canvas indices (0 = first generated token)."""

    row: RowLike
    step: int
    committed: list[tuple[int, int]]  # (position, token) committed this step
    remasked: list[int]  # positions re-masked by revision this step
    stable: int  # canvas[:stable] is final: committed and never to change
    end: int  # output length bound: positions >= end are gone (stop token or canvas end)
    done: bool
    finish_reason: str | None = None  # "stop" (stop token) | "length" (canvas full)
    canvas: list[int] | None = None  # canvas[:end] (mask id where masked) when record_canvas
    # positions rewritten by editing (also in committed)
    edited: list[int] = field(default_factory=list)


@dataclass
class DecodeResult:
    tokens: list[int]  # the output, stop token excluded
    finish_reason: str
    nfe: int  # forward passes this row took part in
    steps: int
    revisions: int
    seconds: float = 0.0
    edits: int = 0  # committed tokens rewritten by editing (editing_threshold)
    accepted: list[int] | None = None  # verify decoding: drafts kept, per pass that verified some
    wide_passes: int = 0  # verify decoding: passes that fed drafts with k masks behind them
    copied: int = 0  # verify decoding: output tokens that were kept copy drafts

    @property
    def tpf(self) -> float:
        return len(self.tokens) / max(self.nfe, 1)


@dataclass
class Row:
    """One sequence being decoded: settings, canvas (device + host mirror), block position, counters."""

    prompt: torch.Tensor  # (P,) long
    cfg: SamplerConfig
    mask_id: int
    stop_ids: frozenset[int]
    block_length: int
    aligned: bool  # blocks at absolute multiples of block_length (block-causal models)
    model_block: int | None  # the model's attention block size if block_causal, else None
    vocab_limit: int | None = None
    cache: KVCache | None = None
    cache_mode: str = "none"  # a name from sampling.core.caches.CACHE_MODES
    refresh_every: int = 0  # approximate caches: full recompute every k steps in a block (0: off)
    exact: int = 0  # window cache: the cached prefix whose keys/values are final
    shift: bool = False  # the model's logit shift (token j predicted from position j - 1)
    generator: torch.Generator | None = None
    prefill: dict[int, int] | None = None  # canvas position -> token fixed before decoding
    suffix: torch.Tensor | None = None  # (S,) tokens after the canvas (infilling)
    constraint: Constraint | None = None
    tag: object = None  # owner's handle (the engine's request)
    canvas: torch.Tensor = field(init=False)  # (N,) long, device
    committed: torch.Tensor = field(init=False)  # (N,) bool, device
    revisions: torch.Tensor = field(init=False)  # (N,) int32, device: re-masks per position
    fixed: torch.Tensor = field(init=False)  # (N,) bool, device: prefilled, never revised
    stop_tensor: torch.Tensor = field(init=False)  # (n_stops,) long, device

    def __post_init__(self) -> None:
        n, dev = self.cfg.max_new_tokens, self.prompt.device
        self.P, self.N = int(self.prompt.shape[0]), n
        self.prompt_ids: list[int] = self.prompt.tolist()
        self.host_tokens = [self.mask_id] * n  # mask id where masked
        self.host_committed = [False] * n
        for pos, tok in (self.prefill or {}).items():
            self.host_tokens[pos], self.host_committed[pos] = int(tok), True
        self.canvas = torch.tensor(self.host_tokens, dtype=torch.long, device=dev)
        self.committed = torch.tensor(self.host_committed, dtype=torch.bool, device=dev)
        self.fixed = self.committed.clone()
        self.revisions = torch.zeros(n, dtype=torch.int32, device=dev)
        self.stop_tensor = torch.tensor(sorted(self.stop_ids), dtype=torch.long, device=dev)
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
        self.post_steps = 0  # editing: passes over the current block after it filled
        self.edited = False  # editing: whether the last pass rewrote a token
        self.nfe = self.steps = self.n_revisions = self.n_edits = 0
        self._first_masked = 0  # no masked position before it (without revision)
        self.done = False
        self.finish_reason: str | None = None
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self.advance()

    # ---- geometry -----------------------------------------------------------------------------
    def block_bounds(self, b: int) -> tuple[int, int]:
        lo = max(0, b * self.block_length - self.offset)
        hi = min(self.end, (b + 1) * self.block_length - self.offset)
        return lo, max(lo, hi)

    def block_span(self) -> tuple[int, int]:
        """Canvas positions [lo, hi) of the block being decoded."""
        return self.block_bounds(self.block)

    def input_len(self) -> int:
        """Tokens of prompt + canvas this row feeds to the next forward pass."""
        if self.model_block is None:  # bidirectional/causal: the whole live canvas (+ suffix)
            return self.P + self.end + self.S
        _, hi = self.block_span()  # block-causal: nothing after the model block holding the window
        abs_hi = self.P + hi
        return min(self.P + self.end, math.ceil(abs_hi / self.model_block) * self.model_block)

    def sequence(self, length: int) -> torch.Tensor:
        if self.suffix is not None:
            return torch.cat((self.prompt, self.canvas[: self.end], self.suffix))  # (P+end+S,)
        return torch.cat((self.prompt, self.canvas[: length - self.P]))  # (length,)

    def host_sequence(self) -> list[int]:
        """Prompt + live canvas as host ints (mask id where masked)."""
        return self.prompt_ids + self.host_tokens[: self.end]

    def segment(self) -> Segment:
        """This row's share of the next forward pass, laid out by its cache mode."""
        return CACHE_MODES[self.cache_mode].segment(self)

    @property
    def revising(self) -> bool:
        return self.cfg.revise_threshold is not None and self.cfg.max_revisions > 0

    @property
    def editing(self) -> bool:
        return self.cfg.editing_threshold is not None

    def masked_in_window(self) -> int:
        lo, hi = self.block_span()
        return hi - lo - sum(self.host_committed[lo:hi])

    def commit_count(self) -> int:
        """k: how many positions the policy must commit this step (at least one while any is masked)."""
        n_masked = self.masked_in_window()
        if n_masked == 0:
            return 0
        k = 1
        if self.steps_per_block is not None:
            k = math.ceil(n_masked / max(1, self.steps_per_block - self.block_steps + 1))
        return min(max(k, 1), n_masked)

    # ---- the host side of a step --------------------------------------------------------------
    def begin_step(self) -> None:
        self.nfe += 1
        self.steps += 1
        self.block_steps += 1
        if self.editing and self.masked_in_window() == 0:
            self.post_steps += 1

    def record(
        self,
        committed: list[tuple[int, int]],
        remasked: list[int],
        edited: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Mirror one step's commits, re-masks and edits on the host."""
        for pos in remasked:
            self.host_tokens[pos], self.host_committed[pos] = self.mask_id, False
        self.n_revisions += len(remasked)
        for pos, tok in committed:
            self.host_tokens[pos], self.host_committed[pos] = tok, True
        for pos, tok in edited:
            self.host_tokens[pos] = tok
        self.n_edits += len(edited)
        self.edited = bool(edited)

    def truncate(self, end: int) -> None:
        """Drop canvas positions >= end (a stop token at end - 1), on the device and the host."""
        self.end = end
        self.stale = True
        self.canvas[end:] = self.mask_id
        self.committed[end:] = False
        for pos in range(end, self.N):
            self.host_tokens[pos], self.host_committed[pos] = self.mask_id, False

    def advance(self) -> None:
        """Move to the first block with a masked position; finish if there is none.

        With revision on, a filled block gets one more pass that checks its tokens before the
        decoder moves on (it moves on once a check re-masks nothing). With editing on, a filled
        block gets passes that may only edit (``_post_pass_due``), and a stop token with nothing
        masked before it ends the row at once (LLaDA2.1's early stop at EOS)."""
        while True:
            lo, hi = self.block_span()
            if lo >= self.end or (
                self.editing
                and self.stop_pos is not None
                and all(self.host_committed[: self.stop_pos])
            ):
                self._finish()
                return
            if not all(self.host_committed[lo:hi]):
                return
            if self.revising and self.verified_block != self.block:
                return
            if self.editing and self._post_pass_due():
                return
            self.block += 1
            self.block_steps = self.post_steps = 0
            self.edited = False

    def _post_pass_due(self) -> bool:
        """Editing, over a filled block: one more pass? (the block-refinement rule of LLaDA2.1 as
        diffusers' ``BlockRefinementScheduler`` runs it). After the pass that filled the block, one
        follows unless the unmasking used the whole step budget (``steps`` per block, else the
        block length); after a pass that only edited, another follows while it still edited and at
        most ``max_post_steps`` such passes have run."""
        if self.post_steps == 0:
            budget = self.steps_per_block or self.block_length
            return 0 < self.block_steps < budget
        return self.edited and self.post_steps <= self.cfg.max_post_steps

    def _finish(self) -> None:
        self.done = True
        self.finish_reason = "stop" if self.stop_pos is not None else "length"
        self.seconds = time.perf_counter() - self.t0

    def stable(self) -> int:
        if self.done:
            return self.output_end()
        if self.revising or self.editing:
            return self.block_span()[0]
        while self._first_masked < self.end and self.host_committed[self._first_masked]:
            self._first_masked += 1
        return min(self._first_masked, self.end)

    def event(self, step: int, committed: list[tuple[int, int]], remasked: list[int]) -> RowEvent:
        return RowEvent(
            row=self,
            step=step,
            committed=committed,
            remasked=remasked,
            stable=self.stable(),
            end=self.output_end(),
            done=self.done,
            finish_reason=self.finish_reason,
            canvas=self.host_tokens[: self.end] if self.cfg.record_canvas else None,
        )

    def output_end(self) -> int:
        return self.stop_pos if self.stop_pos is not None else self.end

    def exact_prefix(self) -> int:
        """Cached positions whose keys and values are final (the window cache's exact prefix)."""
        if self.cache is None:
            return 0
        return self.exact if self.cache_mode == "window" else self.cache.length

    def take_prefix(self, n: int) -> None:
        self.exact = n  # the window cache recomputes from here

    def result(self) -> DecodeResult:
        return DecodeResult(
            tokens=self.host_tokens[: self.output_end()],
            finish_reason=self.finish_reason or "length",
            nfe=self.nfe,
            steps=self.steps,
            revisions=self.n_revisions,
            seconds=self.seconds,
            edits=self.n_edits,
        )
