"""``Decoder``: parallel refinement of masked canvases (bidirectional and block-causal models); only
the loop, built from the shared primitives of ``sampling/core/``.

One step: gather every live row's window (``core/caches``) -> one forward pass over all of them ->
pure batched selection on the device (``core/select``, with the revision and editing hooks of
``core/hooks``) -> write the commits and edits into the device canvases -> one device-to-host
transfer of the step's events -> host bookkeeping per row (``core/state``: stops, blocks, finish).
Constrained rows (structured output) add their own reads (``hooks.commit_constrained``); nothing
else in a step reads the device.

Rows are independent: their own sampler settings, seeded generator, canvas length and block
position, and the packed forward pass keeps them apart, so a row's output does not depend on what
else is in the batch. Rows may join and leave between steps (``step`` takes any list of rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...errors import ConfigError
from ...models.host import to_device
from ...models.kvcache import KVCache
from ...models.transformer import Transformer
from ...runtime import Runtime, as_runtime
from ..core.caches import CACHE_CHOICES, resolve_cache_mode, resolve_window
from ..core.config import SamplerConfig
from ..core.hooks import (
    Constraint,
    apply_stop,
    commit_constrained,
    editing_inputs,
    remask,
    revision_inputs,
    rewrite,
)
from ..core.noise import request_generator
from ..core.policies import POLICIES
from ..core.select import choose, draw_noise, draw_tokens, forbid, pad_windows, policy_scores
from ..core.state import DecodeResult, Row, RowEvent
from .row_decoder import RowDecoder, row_stops

NOTHING, REMASKED = -1, -2  # event codes besides committed tokens; an edit to token t: EDITED - t
EDITED = -3

__all__ = ["Constraint", "DecodeResult", "Decoder", "Row", "RowEvent", "refine"]


def _pad(parts: list[torch.Tensor], value: float | bool) -> torch.Tensor:
    """Per-row window vectors (n_i,) -> (R, W)."""
    if len(parts) == 1:
        return parts[0][None]
    return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True, padding_value=value)


def _write(
    row: Row,
    take: torch.Tensor,
    x0: torch.Tensor,
    bad: torch.Tensor | None,
    edit: torch.Tensor | None,
) -> None:
    """Commit ``take``, re-mask ``bad`` and rewrite ``edit`` (window vectors (n,)) on the row's
    device canvas."""
    lo, hi = row.block_span()
    canvas, committed = row.canvas[lo:hi], row.committed[lo:hi]  # views (n,)
    if bad is not None:
        canvas.masked_fill_(bad, row.mask_id)
        committed &= ~bad
        if row.revising:
            row.revisions[lo:hi] += bad
    if row.constraint is None:  # a constrained row's commits are asked one by one, later
        canvas.copy_(torch.where(take if edit is None else take | edit, x0, canvas))
        committed |= take


def _host_update(
    row: Row, step: int, k: int, codes: list[int], order: torch.Tensor, logits: torch.Tensor
) -> RowEvent:
    """Mirror one row's step on the host from its window's event codes (token: committed, -1:
    nothing, -2: re-masked, EDITED - token: rewritten); stops, blocks, finish."""
    lo = row.block_span()[0]
    remasked = [lo + j for j, c in enumerate(codes) if c == REMASKED]
    edited = [(lo + j, EDITED - c) for j, c in enumerate(codes) if c <= EDITED]
    if k == 0:  # a pass over a filled block: revision's check, editing's post pass
        row.record([], remasked, edited)
        if not remasked:
            row.verified_block = row.block
        committed = apply_stop(row, edited)
    else:
        if row.constraint is None:
            committed = [(lo + j, c) for j, c in enumerate(codes) if c >= 0]
        else:
            committed = commit_constrained(row, order, [c >= 0 for c in codes], codes, logits)
        row.record(committed, remasked, edited)
        committed = apply_stop(row, committed + edited)
    row.advance()
    ev = row.event(step, committed, remasked)
    ev.edited = [p for p, _ in edited if p < row.end]
    return ev


@dataclass
class Windows:
    """The step's windows of every row, padded to the widest (W)."""

    widths: list[int]  # n_i = hi - lo of each row
    logits: torch.Tensor  # (R, W, V) float32, forbidden tokens at -inf
    masked: torch.Tensor  # (R, W) bool
    k: list[int]  # per row: positions the policy must commit (0: a check pass)
    cur: torch.Tensor | None  # (R, W) tokens on the canvas; None: no row revises or edits
    eligible: torch.Tensor | None  # (R, W) bool: may be re-masked by revision
    bound: list[float]  # per row: revision's confidence bound (0: no revision)
    editable: torch.Tensor | None = None  # (R, W) bool: may be rewritten by editing
    edit_bound: list[float] | None = None  # per row: editing's bound (1: no editing)


def gather_windows(rows: Sequence[Row], logits: Sequence[torch.Tensor]) -> Windows:
    """Pad the rows' window logits (n_i, V) and canvas state into batch tensors (device only)."""
    widths = [int(lg.shape[0]) for lg in logits]
    L = forbid(pad_windows(logits), rows[0].mask_id, rows[0].vocab_limit)  # (R, W, V)
    for i, r in enumerate(rows):
        if r.constraint is not None:
            L[i, : widths[i]] = r.constraint.mask_logits(r, r.block_span()[0], L[i, : widths[i]])
    masked = ~_pad([r.committed[slice(*r.block_span())] for r in rows], True)  # (R, W)
    w = Windows(widths, L, masked, [r.commit_count() for r in rows], None, None, [])
    if any(r.revising or r.editing for r in rows):
        cur = [r.canvas[slice(*r.block_span())] for r in rows]  # (n_i,) each
        revision = [revision_inputs(r, c) for r, c in zip(rows, cur)]
        w.cur, w.eligible = _pad(cur, rows[0].mask_id), _pad([e for e, _ in revision], False)
        w.bound = [b for _, b in revision]
        if any(r.editing for r in rows):
            editing = [editing_inputs(r, c) for r, c in zip(rows, cur)]
            w.editable = _pad([e for e, _ in editing], False)
            w.edit_bound = [b for _, b in editing]
    return w


def select_commits(
    rows: Sequence[Row], w: Windows
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """take, x0, bad (R, W) (None: no row revises), edit (R, W) (None: no row edits) and the
    order (R, W) of positions by score, for every row at once."""
    dev = w.logits.device
    gens = [r.generator for r in rows]
    names = [r.cfg.policy for r in rows]
    temps, top_ps = [r.cfg.temperature for r in rows], [r.cfg.top_p for r in rows]
    top_ks = [r.cfg.top_k for r in rows]
    x0 = draw_tokens(w.logits, w.widths, temps, top_ps, gens, top_ks)  # (R, W)
    probs = w.logits.softmax(-1)  # (R, W, V)
    noise = draw_noise((len(rows), w.logits.shape[1]), w.widths, names, gens, dev)
    inf = float("inf")
    tau = [r.cfg.threshold if POLICIES[r.cfg.policy].rule == "threshold" else inf for r in rows]
    score = policy_scores(probs, x0, noise, names)  # (R, W)
    k_tau = to_device([w.k, tau], torch.float32, dev)  # (2, R): one upload for both
    take, order = choose(score, w.masked, k_tau[0].long(), k_tau[1])  # (R, W) each
    bad = None
    if w.cur is not None and w.eligible is not None:
        bound = to_device(w.bound, torch.float32, dev)  # (R,)
        bad = remask(probs, w.cur, w.masked, w.eligible, bound)
    edit = None
    if w.cur is not None and w.editable is not None and w.edit_bound is not None:
        eb = to_device(w.edit_bound, torch.float32, dev)  # (R,)
        edit = rewrite(probs, x0, w.cur, w.editable & ~w.masked, eb)
        if bad is not None:
            edit &= ~bad
    return take, x0, bad, edit, order


@torch.no_grad()
def refine(rows: Sequence[Row], logits: Sequence[torch.Tensor], step: int) -> list[RowEvent]:
    """Apply one step to live rows given each row's window logits (hi - lo, V)."""
    for r in rows:
        r.begin_step()
    w = gather_windows(rows, logits)
    take, x0, bad, edit, order = select_commits(rows, w)
    for i, (r, n) in enumerate(zip(rows, w.widths)):
        part = [None if t is None else t[i, :n] for t in (bad, edit)]
        _write(r, take[i, :n], x0[i, :n], part[0], part[1])
    codes = torch.where(take, x0, NOTHING)  # (R, W)
    if bad is not None:
        codes = codes.masked_fill(bad, REMASKED)
    if edit is not None:
        codes = torch.where(edit, EDITED - x0, codes)
    events = codes.tolist()  # the step's one device-to-host transfer
    return [
        _host_update(r, step, w.k[i], events[i][:n], order[i, :n], w.logits[i, :n])
        for i, (r, n) in enumerate(zip(rows, w.widths))
    ]


class Decoder(RowDecoder[Row]):
    """Builds rows for a model and runs batched refinement steps over them."""

    runtime: Runtime

    def __init__(
        self,
        model: Runtime | Transformer,
        mask_id: int,
        stop_ids: Sequence[int],
        pad_id: int = 0,
        vocab_limit: int | None = None,
        use_cache: bool = True,
        cache_mode: str = "auto",
        refresh_every: int = 0,
    ) -> None:
        self.runtime = as_runtime(model)  # a network alone runs on a fresh torch runtime
        self.use_cache = use_cache  # False: no cache at all (the uncached reference path)
        if cache_mode not in CACHE_CHOICES:
            raise ConfigError(f"cache mode must be one of {CACHE_CHOICES}, got {cache_mode!r}")
        self.cache_mode = cache_mode
        self.refresh_every = refresh_every
        self.vocab_limit = vocab_limit  # ids >= this are padding rows of the embedding
        self.mask_id = mask_id
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.pad_id = pad_id
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def resolve_cache_mode(self) -> str:
        return resolve_cache_mode(self.runtime.config.attention, self.cache_mode, self.use_cache)

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
        mcfg = self.runtime.config
        self.check_request(prompt_ids, cfg, prefill, len(suffix or ()))
        if POLICIES[cfg.policy].rule == "verify":
            raise ConfigError(
                f"policy verify needs a causal model that drafts; this one is {mcfg.attention}"
            )
        if suffix and mcfg.attention != "bidirectional":
            raise ConfigError(
                "a suffix after the canvas needs a bidirectional model; "
                "use the fill-in-the-middle prompt format for this one"
            )
        block_causal = mcfg.attention == "block_causal"
        bl = cfg.block_length or (mcfg.block_size if block_causal else min(32, cfg.max_new_tokens))
        gen = None
        if cfg.temperature > 0 or POLICIES[cfg.policy].needs_noise:
            gen = request_generator(cfg.seed, self.device)
        mode = self.resolve_cache_mode()
        w = resolve_window(
            cfg.window, mcfg.block_size if block_causal else None, mode, self.device.type
        )
        if w and w < mcfg.block_size:  # decode sub-blocks of w, computing only their positions
            bl, mode = min(bl, w), "window"
        prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=self.device)
        sfx = torch.tensor(list(suffix), dtype=torch.long, device=self.device) if suffix else None
        stops = row_stops(self.stop_ids, extra_stops)  # stop_at_eos is read by the hooks
        return Row(
            prompt=prompt,
            cfg=cfg,
            mask_id=self.mask_id,
            stop_ids=stops,
            block_length=bl,
            aligned=block_causal,
            model_block=mcfg.block_size if block_causal else None,
            generator=gen,
            tag=tag,
            prefill=prefill,
            suffix=sfx,
            constraint=constraint,
            vocab_limit=self.vocab_limit,
            cache=KVCache(self.runtime.kv_pool) if mode != "none" else None,
            cache_mode=mode,
            refresh_every=self.refresh_every,
            shift=mcfg.logit_shift,
        )

    @torch.no_grad()
    def step(self, rows: Sequence[Row]) -> list[RowEvent]:
        """One forward pass over the live rows; every row advances one refinement step."""
        rows = [r for r in rows if not r.done]
        if not rows:
            return []
        self.step_count += 1
        logits = self.runtime.forward_segments([r.segment() for r in rows])  # (hi-lo, V) each
        return refine(rows, logits, self.step_count)
