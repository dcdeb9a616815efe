"""The verify decoder: a causal network drafts k tokens by diffusion and checks them itself, in one pass.

One row's pass is one packed segment (``Segment.draft``, runtime/segment.py):

    [final tokens not yet cached | drafts d_0 .. d_{n-1} | k masks]

The final tokens and the drafts form the *causal stream*: their keys and values enter the row's KV
cache, which is therefore an exact AR cache. The masks attend to the whole stream and to each other
and never enter the cache. Causal logits: c_0 (at the last final token) predicts d_0's position,
c_j (at d_{j-1}) predicts d_j's, c_n the position after the last draft. The mask at position x
predicts the token at x + 1 (the network's one next-token head), so the k masks draft the k tokens
that follow c_n's.

Acceptance, per row. Greedy: the longest draft prefix that the causal argmax reproduces, then the
causal argmax after it (the *bonus*). Sampling: the speculative p/q test (Leviathan et al. 2023;
Chen et al. 2023): draft d_j, drawn from q_j, is kept with probability min(1, p_j(d_j) / q_j(d_j));
the first rejected one is replaced by a draw from norm(max(0, p_j - q_j)); so every output token
follows the model's AR distribution p at the request's temperature and top_p. When every draft is
kept the bonus comes from p_n and the masks' predictions become the next pass's drafts (they
assumed every draft kept); otherwise they are void and the next pass drafts afresh. How many
drafts and masks a pass feeds is the runtime's choice (``runtime/pass_plan.py``: what its passes
cost), never the acceptance rule's. ``draft = 0`` feeds no masks: plain AR decoding of the same
weights, one token per pass. A row with a
``Constraint`` (structured output, tool calls, banned tokens, logprobs) checks its drafts left to
right against the constrained causal distribution (``accept_constrained``): each position's logits
are masked by the constraint, the pick must be allowed, and a draft is kept only if it is that pick
(greedy) or passes the p/q test against it (sampling), so every structured reply stays valid and
is the constrained AR output. Policy ``threshold`` is
the lossy mode of the same weights (greedy rows): a draft is also kept, unverified, when its own
confidence reaches the threshold. Prefilled canvas
positions (a forced ``<think>``, a structured skeleton) are forced: a draft there is the forced
token and is always kept.

Written here, not taken from a library: the draft block lives inside our packed, cached forward
pass (per-row caches, continuous batching), which no speculative-decoding library drives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...errors import ConfigError
from ...models.host import to_device
from ...models.kvcache import KVCache
from ...models.transformer import Transformer
from ...runtime import Runtime, as_runtime
from ...runtime.pass_plan import PassPlanner
from ...runtime.segment import Segment
from ..core.config import SamplerConfig
from ..core.hooks import Constraint
from ..core.noise import filtered, request_generator, sample_with_distribution
from ..core.policies import POLICIES
from ..core.select import forbid_host, greedy_ids, top_probabilities
from ..core.state import DecodeResult, RowEvent
from .copy_drafts import NgramIndex, acceptance, agreement, expected_kept, extends, mean_kept
from .row_decoder import RowDecoder, row_stops


@dataclass
class VerifyRow:
    """One sequence under verify decoding: final tokens, pending drafts, cache, counters."""

    prompt_ids: list[int]
    cfg: SamplerConfig
    k: int  # masks per pass (0: plain AR)
    stop_ids: frozenset[int]
    cache: KVCache
    mask_id: int
    device: torch.device
    generator: torch.Generator | None = None
    prefill: dict[int, int] = field(default_factory=dict)  # canvas position -> forced token
    tag: object = None
    constraint: Constraint | None = None
    host_tokens: list[int] = field(default_factory=list)  # final output tokens
    drafts: list[int] = field(default_factory=list)  # unverified, after host_tokens
    # the drafts' own probabilities (p, or q sampled)
    conf: list[float] = field(default_factory=list)
    q: torch.Tensor | None = None  # (n, V) the drafts' distributions (sampling only)
    # per pass that verified drafts: how many kept
    accepted: list[int] = field(default_factory=list)
    wide: int = 0  # passes that fed more than k positions after the final tokens
    copied: int = 0  # how many of ``drafts`` were copied from the context (copy_drafts.py)
    copy_kept: int = 0  # copied tokens kept, and tried (each up to the first rejected one)
    copy_tried: int = 0
    nfe: int = 0
    done: bool = False
    finish_reason: str | None = None
    seconds: float = 0.0
    t0: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.P, self.N = len(self.prompt_ids), self.cfg.max_new_tokens
        # the canvas as constraints read it (0 = the first output token): final + forced positions
        self.canvas = torch.full((self.N,), self.mask_id, dtype=torch.long)  # (N,)
        self.committed = torch.zeros(self.N, dtype=torch.bool)  # (N,)
        for pos, tok in self.prefill.items():
            self.canvas[pos], self.committed[pos] = tok, True
        self._take_forced()
        copying = self.cfg.copy_drafts and self.k > 0
        self.index = NgramIndex(self.prompt_ids) if copying else None

    cache_mode = "verify"  # the exact causal stream (engine/prefix_cache.py)

    @property
    def steps(self) -> int:
        return self.nfe

    def host_sequence(self) -> list[int]:
        """Prompt + final tokens: what the cache holds keys/values of after a pass."""
        return self.prompt_ids + self.host_tokens

    def input_len(self) -> int:
        """Tokens this row feeds to the next forward pass."""
        return self.P + len(self.host_tokens) - self.cache.length + len(self.drafts) + self.k

    def _take_forced(self) -> None:
        """Forced positions right after the final tokens are final already."""
        while len(self.host_tokens) in self.prefill and len(self.host_tokens) < self.N:
            self.host_tokens.append(self.prefill[len(self.host_tokens)])

    def _pass_rate(self, planner: PassPlanner, conf: list[float], width: int | None) -> float:
        """Tokens a pass is expected to give per position of its cost, with drafts of own
        probabilities ``conf`` on ``width``: the kept drafts, the bonus, and the masks' drafts
        (worth what this row's verifying passes keep) when every draft is kept."""
        room, fed = self.N - len(self.host_tokens) - 1, self.uncached()
        n, m = planner.plan(conf, self.k, room, fed, fed - 1, width)
        masks = math.prod(conf[:n]) * mean_kept(self.accepted) if m else 0.0
        return (1 + expected_kept(conf[:n]) + masks) / planner.cost(fed + n + m, fed - 1)

    def _copy_drafts(self, planner: PassPlanner) -> None:
        """Draft by copying from the context instead, where its last tokens recur and the copy
        either continues every draft held on a long match (copy_drafts.extends) or promises more
        tokens per position of cost than they do (at the row's measured acceptance of copied
        tokens beyond the drafts it repeats)."""
        self.copied = 0
        if self.index is None:
            return
        self.index.extend(self.host_tokens[len(self.index.seq) - self.P :])
        room = self.N - len(self.host_tokens) - 1
        copy, match = self.index.lookup(min(planner.policy.copy_width, room))
        if not copy:
            return
        at = len(self.host_tokens)
        copy = [self.prefill.get(at + j, t) for j, t in enumerate(copy)]
        rate = acceptance(self.copy_kept, self.copy_tried, match)
        same = agreement(copy, self.drafts)  # drafted alike: as likely kept as the drafts
        conf = self.conf[:same] + [rate] * (len(copy) - same)
        width = planner.policy.copy_width
        if extends(copy, self.drafts, match, rate) or self._pass_rate(
            planner, conf, width
        ) > self._pass_rate(planner, self.conf, None):
            self.drafts, self.conf, self.q, self.copied = copy, conf, None, len(copy)

    def uncached(self) -> int:
        """Final tokens not in the cache yet (the next pass feeds them before its drafts)."""
        return self.P + len(self.host_tokens) - self.cache.length

    def segment(self, planner: PassPlanner) -> Segment:
        """This pass's segment: the uncached final tokens, the drafts and masks ``planner`` says."""
        self._copy_drafts(planner)
        seq = self.prompt_ids + self.host_tokens
        start = self.cache.length
        room = self.N - len(self.host_tokens) - 1
        width = planner.policy.copy_width if self.copied else None
        n, m = planner.plan(self.conf, self.k, room, len(seq) - start, len(seq) - start - 1, width)
        self.copied = min(self.copied, n)
        if n < len(self.drafts):
            self.drafts, self.conf = self.drafts[:n], self.conf[:n]
            if self.q is not None:
                self.q = self.q[:n]  # (n, V)
        feed = seq[start:] + self.drafts
        self.wide += len(self.drafts) + m > self.k  # drafts with k masks behind them
        ids = to_device(feed + [self.mask_id] * m, torch.long, self.device)  # (n + m,)
        lo = len(seq) - start - 1
        return Segment(ids, start, lo, len(feed) + m, self.cache, append=len(feed), draft=m)

    # ---- after the pass ---------------------------------------------------------------------------
    def forced(self, pos: int) -> int | None:
        return self.prefill.get(pos)

    @property
    def lossy(self) -> float | None:
        """The threshold that keeps a confident draft unverified (policy threshold), else None."""
        return self.cfg.threshold if self.cfg.policy == "threshold" else None

    def finish(
        self,
        new: list[int],
        all_kept: bool,
        drafts: list[int],
        q: torch.Tensor | None,
        conf: list[float],
    ) -> RowEvent:
        """Take the pass's new final tokens (kept drafts + bonus), roll the cache back to them,
        take the masks' ``drafts`` (and their distributions ``q``) if every draft was kept; stops."""
        base = len(self.host_tokens)
        if self.drafts:
            self.accepted.append(len(new) - 1)
        if self.copied:
            kept = min(len(new) - 1, self.copied)
            self.copy_kept += kept
            self.copy_tried += kept + (kept < self.copied)
            self.copied = 0
        self.cache.truncate(self.P + base + len(new) - 1)  # the kept drafts; the bonus is uncached
        self.drafts, self.q, self.conf = [], None, []
        new = new[: self.N - base]
        stop = next((i for i, t in enumerate(new) if t in self.stop_ids), None)
        # the stop token is committed (its event says which stop ended the row), never output
        committed = [(base + i, t) for i, t in enumerate(new if stop is None else new[: stop + 1])]
        self.host_tokens.extend(new if stop is None else new[:stop])
        if stop is not None or len(self.host_tokens) >= self.N:
            self.done, self.finish_reason = True, "stop" if stop is not None else "length"
            self.seconds = time.perf_counter() - self.t0
        else:
            self._take_forced()
            if all_kept and drafts and len(self.host_tokens) == base + len(new):
                at = len(self.host_tokens)
                self.drafts = [self.prefill.get(at + j, t) for j, t in enumerate(drafts)]
                self.q = q
                self.conf = [1.0 if at + j in self.prefill else c for j, c in enumerate(conf)]
        return RowEvent(
            row=self,
            step=self.nfe,
            committed=committed,
            remasked=[],
            stable=len(self.host_tokens),
            end=len(self.host_tokens) if self.done else self.N,
            done=self.done,
            finish_reason=self.finish_reason,
            canvas=self.view() if self.cfg.record_canvas else None,
        )

    def view(self) -> list[int]:
        """The live canvas, as a diffusion row shows its own: the final tokens, then the rest of
        the ``max_new_tokens`` positions masked (not decided yet)."""
        if self.done:
            return list(self.host_tokens)
        return self.host_tokens + [self.mask_id] * (self.N - len(self.host_tokens))

    def exact_prefix(self) -> int:
        return self.cache.length  # only final tokens' keys and values after a pass

    def take_prefix(self, n: int) -> None:
        pass  # the cache holds the exact stream: nothing to recompute

    def result(self) -> DecodeResult:
        return DecodeResult(
            tokens=list(self.host_tokens),
            finish_reason=self.finish_reason or "length",
            nfe=self.nfe,
            steps=self.nfe,
            revisions=0,
            seconds=self.seconds,
            accepted=list(self.accepted),
            wide_passes=self.wide,
            copied=self.copy_kept,
        )


def accept_greedy(row: VerifyRow, top: list[int]) -> tuple[list[int], bool]:
    """New final tokens from the causal argmax ``top`` (n + 1,): the kept drafts, then the bonus."""
    base, out, tau = len(row.host_tokens), [], row.lossy
    for j, d in enumerate(row.drafts):
        want = row.forced(base + j)
        if want is None and tau is not None and not row.copied and row.conf[j] >= tau:
            want = d  # lossy mode: a confident draft is kept as it is
        want = top[j] if want is None else want
        out.append(want)
        if d != want:
            return out, False
    bonus = row.forced(base + len(row.drafts))
    out.append(top[len(row.drafts)] if bonus is None else bonus)
    return out, True


def pick_allowed(row: VerifyRow, pos: int, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The constrained choice at canvas position ``pos`` from causal logits (V,): the argmax (or a
    draw, sampling) among the tokens the constraint allows; and the masked logits it came from."""
    assert row.constraint is not None
    lg = row.constraint.mask_logits(row, pos, logits[None].clone())[0]  # (V,)
    while True:
        if row.cfg.temperature > 0:
            tok = draw(probabilities(lg[None], row.cfg)[0], row.generator)
        else:
            tok = int(lg.argmax())
        if lg[tok] == float("-inf"):
            raise RuntimeError(f"constraint allows no token at canvas position {pos}")
        if row.constraint.allow(row, pos, tok):
            return tok, lg
        lg[tok] = float("-inf")  # allow() is the final word where mask_logits could not enumerate


def draw_residual(row: VerifyRow, pos: int, resid: torch.Tensor) -> int | None:
    """A draw from norm(resid) (V,) that the constraint allows; None when no such token is left."""
    assert row.constraint is not None
    while float(resid.sum()) > 0:
        tok = draw(resid / resid.sum(), row.generator)
        if row.constraint.allow(row, pos, tok):
            return tok
        resid[tok] = 0.0
    return None


def accept_constrained(row: VerifyRow, causal: torch.Tensor) -> tuple[list[int], bool]:
    """Drafts checked left to right against the constrained causal logits (n + 1, V); each new
    final token is written on the canvas before the next position is asked."""
    base, out = len(row.host_tokens), []
    u = torch.rand(len(row.drafts), generator=row.generator, dtype=torch.float64)
    for j in range(min(len(row.drafts) + 1, row.N - base)):  # nothing past the canvas
        pos = base + j
        d = row.drafts[j] if j < len(row.drafts) else None
        tok = row.forced(pos)
        if tok is None and d is not None and row.cfg.temperature > 0 and row.q is not None:
            assert row.constraint is not None
            lg = row.constraint.mask_logits(row, pos, causal[j][None].clone())[0]  # (V,)
            pj, qj = probabilities(lg[None], row.cfg)[0], row.q[j].to(lg.device)
            if float(u[j]) * float(qj[d]) <= float(pj[d]) and row.constraint.allow(row, pos, d):
                tok = d
            else:
                tok = draw_residual(row, pos, (pj - qj).clamp_min(0))
                if tok is None:
                    tok, _ = pick_allowed(row, pos, causal[j])
        elif tok is None:
            tok, _ = pick_allowed(row, pos, causal[j])
        out.append(tok)
        row.canvas[pos], row.committed[pos] = tok, True
        if tok != d:
            return out, d is None
    return out, True


def probabilities(logits: torch.Tensor, cfg: SamplerConfig) -> torch.Tensor:
    """The sampling distribution (n, V) float64 at the request's temperature, top_k and top_p."""
    return filtered(logits, cfg.temperature, cfg.top_p, cfg.top_k).softmax(-1)


def draw(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def sample_drafts(
    row: VerifyRow, masks: torch.Tensor
) -> tuple[list[int], torch.Tensor, list[float]]:
    """The next drafts drawn from the masks' logits (m, V) at the row's temperature, top_p and
    top_k; their distributions q (m, V); and each draft's own probability under q."""
    cfg = row.cfg
    drawn, q = sample_with_distribution(masks, cfg.temperature, cfg.top_p, row.generator, cfg.top_k)
    return drawn.tolist(), q, q.gather(-1, drawn[:, None])[:, 0].tolist()  # (m,), (m, V), (m,)


def accept_sampled(row: VerifyRow, causal: torch.Tensor) -> tuple[list[int], bool]:
    """The p/q test over the drafts against the causal logits (n + 1, V); see the module docstring."""
    p = probabilities(causal, row.cfg)  # (n + 1, V)
    base, out, gen = len(row.host_tokens), [], row.generator
    n = len(row.drafts)
    u = torch.rand(n, generator=gen, dtype=torch.float64, device=p.device)  # (n,)
    keep: list[bool] = []
    if n:  # copied drafts (q None) are point masses: q(d) = 1
        at = torch.arange(n, device=p.device), to_device(row.drafts, torch.long, p.device)
        qd = 1.0 if row.q is None else row.q.to(p.device)[at]  # (n,)
        keep = (u * qd <= p[at]).tolist()  # (n,): each draft's test, one read
    for j, d in enumerate(row.drafts):
        f = row.forced(base + j)
        if f is not None:
            out.append(f)
            continue
        if keep[j]:
            out.append(d)
            continue
        pj = p[j]
        if row.q is None:  # a point mass at d: the residual is p without d
            resid = pj.clone()
            resid[d] = 0.0
        else:
            resid = (pj - row.q[j].to(p.device)).clamp_min(0)
        out.append(draw(resid / resid.sum() if float(resid.sum()) > 0 else pj, gen))
        return out, False
    f = row.forced(base + n)
    out.append(draw(p[n], gen) if f is None else f)
    return out, True


class VerifyDecoder(RowDecoder[VerifyRow]):
    """Rows of a causal model decoded by drafting and verifying; batched steps, like ``Decoder``."""

    runtime: Runtime

    def __init__(
        self,
        model: Runtime | Transformer,
        stop_ids: Sequence[int],
        vocab_limit: int | None = None,
    ) -> None:
        cfg = model.config
        if cfg.attention != "causal" or cfg.logit_shift:
            raise ConfigError(
                "verify decoding needs a causal model without logit shift, this one is "
                f"{cfg.attention}{' with shift' if cfg.logit_shift else ''}"
            )
        self.runtime = as_runtime(model)  # a network alone runs on a fresh torch runtime
        self.mask_id = cfg.mask_token_id
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.vocab_limit = vocab_limit
        self.step_count = 0

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def resolve_cache_mode(self) -> str:
        return "verify"

    def new_row(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        tag: object = None,
        prefill: dict[int, int] | None = None,
        suffix: Sequence[int] | None = None,
        constraint: Constraint | None = None,
        extra_stops: Sequence[int] | None = None,
    ) -> VerifyRow:
        mcfg = self.runtime.config
        self.check_request(prompt_ids, cfg, prefill)
        if suffix:
            raise ConfigError(
                "a causal model cannot see a suffix; use the fill-in-the-middle prompt format"
            )
        if POLICIES[cfg.policy].rule not in ("verify", "threshold"):
            raise ConfigError(
                f"a causal model decodes with policy verify (or threshold, lossy), not {cfg.policy}"
            )
        if cfg.window is not None:
            raise ConfigError(
                "the decode window applies to block-causal models; this one is causal"
            )
        k = mcfg.draft_length if cfg.draft is None else cfg.draft
        gen = None
        if cfg.temperature > 0:
            gen = request_generator(cfg.seed, self.device)
        stops = row_stops(self.stop_ids, extra_stops, cfg.stop_at_eos)
        return VerifyRow(
            prompt_ids=list(prompt_ids),
            cfg=cfg,
            k=k,
            stop_ids=stops,
            cache=KVCache(self.runtime.kv_pool),
            mask_id=self.mask_id,
            device=self.device,
            generator=gen,
            prefill=dict(prefill or {}),
            tag=tag,
            constraint=constraint,
        )

    @torch.no_grad()
    def step(self, rows: Sequence[VerifyRow]) -> list[RowEvent]:
        """One forward pass over the live rows: each verifies its drafts and drafts anew."""
        rows = [r for r in rows if not r.done]
        if not rows:
            return []
        self.step_count += 1
        planner = self.runtime.planner  # what the runtime says each row's pass should feed
        segs = [r.segment(planner) for r in rows]
        out = self.runtime.forward_segments(segs)
        logits = [
            forbid_host(o.float(), self.mask_id, self.vocab_limit) for o in out
        ]  # (1+n+m, V) each
        greedy = [r.cfg.temperature <= 0 for r in rows]
        top = greedy_ids(logits) if any(greedy) else []  # (1 + n_i + m_i,) each
        picks = []  # per row: new final tokens, all kept, the next drafts, their q and probabilities
        spans = []  # per row: where its kept greedy drafts sit in its logits (their probabilities)
        for i, (r, s) in enumerate(zip(rows, segs)):
            r.nfe += 1
            n, m = len(r.drafts), s.draft
            if r.constraint is not None:
                new, kept = accept_constrained(r, logits[i][: n + 1].clone())
            elif greedy[i]:
                new, kept = accept_greedy(r, top[i][: n + 1])
            else:
                new, kept = accept_sampled(r, logits[i][: n + 1])
            drafts: list[int] = []
            dconf: list[float] = []
            q = None
            if kept and m and greedy[i]:
                drafts = top[i][n + 1 : n + 1 + m]
            elif kept and m:
                drafts, q, dconf = sample_drafts(r, logits[i][n + 1 : n + 1 + m])
            picks.append((new, kept, drafts, q, dconf))
            spans.append((n + 1, n + 1 + len(drafts)) if greedy[i] else (n + 1, n + 1))
        # the greedy drafts' own probabilities, for the rows that keep them (one read)
        conf = top_probabilities(logits, spans) if any(a < b for a, b in spans) else []
        return [
            r.finish(new, kept, drafts, q, conf[i] if greedy[i] and drafts else dconf)
            for i, (r, (new, kept, drafts, q, dconf)) in enumerate(zip(rows, picks))
        ]
