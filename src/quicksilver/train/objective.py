"""Training objectives, chosen by name: block-diffusion SFT (two layouts) and the AR baseline.

``diffusion`` (BD3-LM style, two copies): the input is ``[x_0 ; x_t]`` — the clean sequence and a
noisy copy of every block that holds answer tokens (the prompt's last partial block included, its
prompt tokens left clean). A noisy block b attends to the clean copy of blocks < b and to itself;
the clean copy is plain block-causal. So every answer block is trained under exactly the
conditions of inference (earlier blocks committed, the current block partly masked, later blocks
absent), and every answer token is supervised in one pass.

``diffusion_single``: one copy; per example one answer block is noised, earlier blocks stay clean,
everything after it is dropped; the model's own block-causal mask applies.

Noise (both): the prompt is never masked; per (example, block) t ~ U(eps, 1) (stratified over the
batch) and each answer token in the block is masked with probability t; the loss is cross-entropy
on masked tokens weighted 1/t, summed and divided by the example's answer length, averaged over the
batch (LLaDA's SFT normalisation). Substitution noise: a fraction ``sub_prob`` of the visible answer
tokens is replaced by a token drawn from the batch's answers; the model must predict the clean
token there (weight ``sub_weight``) and keep the visible tokens (weight ``keep_weight``), which is
what makes low confidence in a committed token a signal for revision. Certainty forcing
(``certainty_weight``, after dParallel, Chen et al. 2025): the entropy of masked positions the model
already predicts right is added to the loss, so that more positions of a block clear the decoding
threshold together (more tokens per forward pass) without moving what it predicts.

``mdm``: plain masked diffusion for a *bidirectional* model (LLaDA's SFT): one t per sequence, the
answer (with its block padding) masked at rate t anywhere, the whole sequence seen at once.

``ar``: the same network with a causal mask, next-token cross-entropy on answer tokens (stop token
included, no trailing pads), averaged per example then over the batch.

``ar_draft`` (TiDAR / I-DLM style, the ``verify`` decoder's network): the ``ar`` loss on the causal
stream, plus ``draft_weight`` times a masked-token loss on ``draft_blocks`` appended blocks of
all-[MASK] positions per sequence. A block anchored at stream position p sits at positions
p+1 .. p+k, attends causally to the stream up to p and bidirectionally to itself, and its position
p+j predicts token p+j+1 (the same next-token head as the stream: the stream's own logit at p gives
token p+1, the block drafts the k after it). Stream positions never attend to a block, so the
stream loss is exactly the AR loss and the AR model is never left. Anchors are drawn uniformly over
the answer; the block size per batch is drawn from [k - k/2, k + k/2] ("sizes around the decode k").
The block's targets are the data's tokens (``draft_teacher="data"``) or the network's own causal
distribution at the same positions, detached (``"self"``: soft cross-entropy against the stream's
logit for that token): what ``verify`` accepts is agreement with the causal head, not with the data,
so "self" trains the drafts toward exactly that (the EAGLE / self-speculation way of training a
drafter on the target model's own predictions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models.transformer import Transformer
from .data import Batch


@dataclass
class NoiseConfig:
    mask_id: int
    block_size: int
    eps: float = 1e-3
    sub_prob: float = 0.0  # fraction of visible answer tokens replaced by a wrong token
    sub_weight: float = 1.0  # loss weight at substituted positions
    # loss weight at untouched visible answer positions (only when sub_prob > 0)
    keep_weight: float = 0.1
    certainty_weight: float = 0.0  # entropy penalty at masked positions already predicted right
    draft_len: int = 8  # ar_draft: the decode k the appended mask blocks are sized around
    draft_blocks: int = 6  # ar_draft: mask blocks appended per sequence
    # ar_draft: block sizes draft_len ± this (None: ± draft_len // 2)
    draft_spread: int | None = None
    draft_weight: float = 1.0  # ar_draft: weight of the masked-token loss beside the AR loss
    # ar_draft: the blocks' targets, the data or the stream's own logits
    draft_teacher: str = "data"


@dataclass
class LossOut:
    loss: torch.Tensor  # scalar
    n_masked: int
    forward_tokens: int  # positions run through the network
    parts: dict[str, torch.Tensor] | None = None  # named terms of a composite loss, for the log


def stratified_t(n: int, eps: float, generator: torch.Generator | None) -> torch.Tensor:
    """n masking ratios in [eps, 1): one per stratum of [0, 1), shuffled (low-variance uniform)."""
    u = (torch.rand((), generator=generator) + torch.arange(n) / n) % 1.0
    u = u[torch.randperm(n, generator=generator)]
    return eps + (1 - eps) * u  # (n,)


def corrupt(
    x0: torch.Tensor,
    ans: torch.Tensor,
    block: torch.Tensor,
    cfg: NoiseConfig,
    generator: torch.Generator | None,
    pool: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Mask (and substitute) answer tokens of x0 (B, N); ``block`` (B, N) ids for per-block t.

    Returns xt (B, N), masked (B, N) bool, subst (B, N) bool, t (B, N) float (per position).
    """
    B, N = x0.shape
    nb = int(block.max()) + 1
    t_blk = stratified_t(B * nb, cfg.eps, generator).view(B, nb)  # (B, nb)
    t = t_blk.gather(1, block.clamp_min(0))  # (B, N)
    masked = ans & (torch.rand((B, N), generator=generator) < t)
    xt = torch.where(masked, torch.full_like(x0, cfg.mask_id), x0)
    subst = torch.zeros_like(masked)
    if cfg.sub_prob > 0 and pool.numel():
        cand = ans & ~masked & (torch.rand((B, N), generator=generator) < cfg.sub_prob)
        repl = pool[torch.randint(0, pool.numel(), (B, N), generator=generator)]  # (B, N)
        subst = cand & (repl != x0)
        xt = torch.where(subst, repl, xt)
    return xt, masked, subst, t


def weighted_ce(
    logits: torch.Tensor,
    x0: torch.Tensor,
    masked: torch.Tensor,
    subst: torch.Tensor,
    visible: torch.Tensor,
    t: torch.Tensor,
    denom: torch.Tensor,
    cfg: NoiseConfig,
) -> torch.Tensor:
    """Per-position weighted CE summed per row / denom (B,), averaged over rows; with
    ``certainty_weight`` plus the entropy of the masked positions whose argmax is already right."""
    logp = logits.float().log_softmax(-1)  # (B, N, V)
    ce = -logp.gather(-1, x0[..., None])[..., 0]  # (B, N)
    w = masked.float() / t
    if cfg.sub_prob > 0:
        w = w + subst.float() * cfg.sub_weight + (visible & ~subst).float() * cfg.keep_weight
    loss = ((ce * w).sum(1) / denom.clamp_min(1)).mean()
    if cfg.certainty_weight > 0:  # dParallel's certainty forcing: sharpen what is already right
        ent = -(logp.exp() * logp).sum(-1)  # (B, N)
        right = masked & (logp.argmax(-1) == x0)  # (B, N)
        loss = loss + cfg.certainty_weight * ((ent * right).sum(1) / denom.clamp_min(1)).mean()
    return loss


def two_copy_mask(
    pos: torch.Tensor, noisy: torch.Tensor, valid: torch.Tensor, bs: int
) -> torch.Tensor:
    """(B, 1, T, T) bool attention mask of the [x_0 ; x_t] layout from positions (B, T) and copy flags."""
    blk = torch.div(pos, bs, rounding_mode="floor")
    qb, kb = blk[:, :, None], blk[:, None, :]  # (B, T, 1), (B, 1, T)
    qn, kn = noisy[:, :, None], noisy[:, None, :]
    m = ((~qn & ~kn & (kb <= qb)) | (qn & ~kn & (kb < qb)) | (qn & kn & (kb == qb))) & valid[
        :, None, :
    ]
    m = m | ~m.any(-1, keepdim=True)  # padding queries: open, outputs unused
    return m[:, None]


def diffusion_loss(
    model: Transformer, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    bs = cfg.block_size
    ids, ans, valid = batch.ids, batch.answer, batch.valid  # (B, L)
    B, L = ids.shape
    start = torch.div(batch.prompt_len, bs, rounding_mode="floor") * bs  # (B,) first noisy position
    n_valid = valid.sum(1)  # (B,)
    N = int((n_valid - start).max())
    j = torch.arange(N)[None, :]  # (1, N)
    npos = (start[:, None] + j).clamp_max(L - 1)  # (B, N)
    nvalid = j < (n_valid - start)[:, None]  # (B, N)
    x0 = ids.gather(1, npos)  # (B, N)
    nans = ans.gather(1, npos) & nvalid
    pool = ids[ans]
    xt, masked, subst, t = corrupt(
        x0,
        nans,
        torch.div(npos, bs, rounding_mode="floor") - (start // bs)[:, None],
        cfg,
        generator,
        pool,
    )
    seq = torch.cat((ids, xt), dim=1)  # (B, L + N)
    pos = torch.cat((torch.arange(L)[None, :].expand(B, L), npos), dim=1)  # (B, L + N)
    noisy = torch.cat(
        (torch.zeros(B, L, dtype=torch.bool), torch.ones(B, N, dtype=torch.bool)), dim=1
    )
    allv = torch.cat((valid, nvalid), dim=1)
    mask = two_copy_mask(pos, noisy, allv, bs)
    shift = bool(
        getattr(getattr(getattr(model, "module", model), "config", None), "logit_shift", False)
    )
    out = model(seq, positions=pos, attn_mask=mask, raw=True)  # (B, L + N, V)
    # Dream / Fast-dLLM v2 convention: position p is predicted from p - 1 as the block sees it:
    if shift:
        q = npos - 1  # the noisy copy inside the block, the clean copy across a block boundary
        same = (j > 0) & (
            torch.div(q, bs, rounding_mode="floor") == torch.div(npos, bs, rounding_mode="floor")
        )
        src = torch.where(same, L + j - 1, q.clamp_min(0))  # (B, N)
        logits = out.gather(1, src[..., None].expand(-1, -1, out.shape[-1]))  # (B, N, V)
    else:
        logits = out[:, L:]  # (B, N, V)
    loss = weighted_ce(logits, x0, masked, subst, nans & ~masked, t, ans.sum(1), cfg)
    return LossOut(loss, int(masked.sum()), int(allv.sum()))


def diffusion_single_loss(
    model: Transformer, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    bs = cfg.block_size
    ids, ans, valid = batch.ids, batch.answer, batch.valid
    B, L = ids.shape
    first = torch.div(batch.prompt_len, bs, rounding_mode="floor")  # (B,) first answer block
    last = torch.div(valid.sum(1) - 1, bs, rounding_mode="floor")  # (B,) last answer block
    pick = first + (torch.rand(B, generator=generator) * (last - first + 1)).long().clamp_max(
        last - first
    )
    blk = torch.div(torch.arange(L), bs, rounding_mode="floor")[None, :]  # (1, L)
    keep = valid & (blk <= pick[:, None])  # (B, L): drop every block after the chosen one
    target = ans & (blk == pick[:, None])
    xt, masked, subst, t = corrupt(ids, target, torch.zeros_like(ids), cfg, generator, ids[ans])
    logits = model(xt, valid=keep)  # (B, L, V) block-causal
    loss = weighted_ce(logits, ids, masked, subst, target & ~masked, t, target.sum(1), cfg)
    return LossOut(loss, int(masked.sum()), int(keep.sum()))


def mdm_loss(
    model: Transformer, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    ids, ans, valid = batch.ids, batch.answer, batch.valid  # (B, L)
    # one t per row
    xt, masked, subst, t = corrupt(ids, ans, torch.zeros_like(ids), cfg, generator, ids[ans])
    logits = model(xt, valid=valid)  # (B, L, V) bidirectional
    loss = weighted_ce(logits, ids, masked, subst, ans & ~masked, t, ans.sum(1), cfg)
    return LossOut(loss, int(masked.sum()), int(valid.sum()))


def next_token_ce(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, int]:
    """Next-token CE of stream logits (B, L-1, V) on answer tokens up to the stop token, averaged
    per example then over the batch's rows that take it (``Batch.ar_rows``); and the number of
    those targets."""
    ids, ans = batch.ids, batch.answer  # (B, L)
    # (B, L-1)
    tgt = ans[:, 1:] & (torch.arange(1, ids.shape[1])[None, :] < batch.content_len[:, None])
    tgt = tgt & batch.ar_rows[:, None]
    rows = tgt.any(1)  # (B,)
    ce = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # (B, L-1)
    per_row = (ce * tgt).sum(1) / tgt.sum(1).clamp_min(1)  # (B,)
    return per_row.sum() / rows.sum().clamp_min(1), int(tgt.sum())


def ar_loss(
    model: Transformer, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    logits = model(batch.ids[:, :-1], valid=batch.valid[:, :-1])  # (B, L-1, V) causal
    loss, n_tgt = next_token_ce(logits, batch)  # collated without trailing pads
    return LossOut(loss, n_tgt, int(batch.valid[:, :-1].sum()))


def draft_mask(L: int, anchors: torch.Tensor, k: int, valid: torch.Tensor) -> torch.Tensor:
    """(B, 1, L + nb*k, L + nb*k) bool mask of a causal stream (B, L) followed by nb mask blocks of
    k positions; block b sees the stream up to ``anchors[:, b]`` and itself, the stream never a block."""
    B, nb = anchors.shape
    T = L + nb * k
    q = torch.arange(T)
    is_blk = q >= L  # (T,)
    blk = torch.where(is_blk, (q - L) // k, -1)  # (T,) block index, -1 on the stream
    # every query's horizon on the stream: itself (stream) or its block's anchor
    # (B, T)
    horizon = torch.where(
        is_blk[None, :], anchors.gather(1, blk.clamp_min(0)[None, :].expand(B, T)), q[None, :]
    )
    kq = torch.arange(L)
    m_stream = (kq[None, None, :] <= horizon[:, :, None]) & valid[:, None, :]  # (B, T, L)
    m_blk = (blk[:, None] == blk[None, L:]) & is_blk[:, None]  # (T, nb*k)
    m = torch.cat((m_stream, m_blk[None].expand(B, T, nb * k)), dim=2)  # (B, T, T)
    m = m | ~m.any(-1, keepdim=True)
    return m[:, None]


def ar_draft_loss(
    model: Transformer, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    ids, valid = batch.ids, batch.valid  # (B, L); no trailing pads
    B, L = ids.shape
    half = cfg.draft_len // 2 if cfg.draft_spread is None else cfg.draft_spread
    k = cfg.draft_len - half + int(torch.randint(0, 2 * half + 1, (), generator=generator))
    nb = cfg.draft_blocks
    # (B,) the first anchor: the prompt's last token predicts the answer's first
    lo = batch.prompt_len - 1
    span = (batch.content_len - 2 - lo).clamp_min(1)  # (B,) anchors lo .. content_len - 3
    anchors = lo[:, None] + (torch.rand((B, nb), generator=generator) * span[:, None]).long()
    j = torch.arange(1, k + 1)  # (k,)
    mpos = (anchors[:, :, None] + j).view(B, nb * k)  # (B, nb*k) positions of the mask tokens
    tpos = mpos + 1  # (B, nb*k) the tokens they predict
    t_ok = tpos < batch.content_len[:, None]
    x0 = ids.gather(1, tpos.clamp_max(L - 1))  # (B, nb*k)
    seq = torch.cat((ids, torch.full_like(mpos, cfg.mask_id)), dim=1)  # (B, L + nb*k)
    pos = torch.cat((torch.arange(L)[None, :].expand(B, L), mpos), dim=1)
    mask = draft_mask(L, anchors, k, valid)
    logits = model(seq, positions=pos, attn_mask=mask, raw=True)  # (B, L + nb*k, V)
    ar, _ = next_token_ce(logits[:, : L - 1], batch)
    draft_logits = logits[:, L:].float()  # (B, nb*k, V)
    if cfg.draft_teacher == "self":  # the stream's logit at tpos - 1 predicts token tpos
        at = (tpos - 1).clamp_max(L - 1)[:, :, None].expand(-1, -1, logits.shape[-1])
        teacher = logits[:, :L].detach().float().gather(1, at).softmax(-1)  # (B, nb*k, V)
        dce = -(teacher * draft_logits.log_softmax(-1)).sum(-1)  # (B, nb*k)
    else:
        dce = F.cross_entropy(draft_logits.transpose(1, 2), x0, reduction="none")  # (B, nb*k)
    draft = ((dce * t_ok).sum(1) / t_ok.sum(1).clamp_min(1)).mean()
    loss = ar + cfg.draft_weight * draft
    return LossOut(loss, int(t_ok.sum()), int(valid.sum()) + B * nb * k, {"ar": ar, "draft": draft})


LossFn = Callable[[Transformer, Batch, NoiseConfig, "torch.Generator | None"], LossOut]
OBJECTIVES: dict[
    str, tuple[LossFn, str, bool]
] = {  # name -> (loss, attention pattern, pad answers)
    "diffusion": (diffusion_loss, "block_causal", True),
    "diffusion_single": (diffusion_single_loss, "block_causal", True),
    "mdm": (mdm_loss, "bidirectional", True),
    "ar": (ar_loss, "causal", False),
    "ar_draft": (ar_draft_loss, "causal", False),
}
