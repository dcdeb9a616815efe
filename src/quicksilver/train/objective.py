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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..models.transformer import DiffusionLM
from .data import Batch


@dataclass
class NoiseConfig:
    mask_id: int
    block_size: int
    eps: float = 1e-3
    sub_prob: float = 0.0  # fraction of visible answer tokens replaced by a wrong token
    sub_weight: float = 1.0  # loss weight at substituted positions
    keep_weight: float = (
        0.1  # loss weight at untouched visible answer positions (only when sub_prob > 0)
    )
    certainty_weight: float = 0.0  # entropy penalty at masked positions already predicted right


@dataclass
class LossOut:
    loss: torch.Tensor  # scalar
    n_masked: int
    forward_tokens: int  # positions run through the network


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
    model: DiffusionLM, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
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
    if (
        shift
    ):  # Dream / Fast-dLLM v2 convention: position p is predicted from p - 1 as the block sees it:
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
    model: DiffusionLM, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
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
    model: DiffusionLM, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    ids, ans, valid = batch.ids, batch.answer, batch.valid  # (B, L)
    xt, masked, subst, t = corrupt(
        ids, ans, torch.zeros_like(ids), cfg, generator, ids[ans]
    )  # one t per row
    logits = model(xt, valid=valid)  # (B, L, V) bidirectional
    loss = weighted_ce(logits, ids, masked, subst, ans & ~masked, t, ans.sum(1), cfg)
    return LossOut(loss, int(masked.sum()), int(valid.sum()))


def ar_loss(
    model: DiffusionLM, batch: Batch, cfg: NoiseConfig, generator: torch.Generator | None
) -> LossOut:
    ids, ans = batch.ids, batch.answer  # (B, L); collated without trailing pads
    tgt = ans[:, 1:] & (
        torch.arange(1, ids.shape[1])[None, :] < batch.content_len[:, None]
    )  # (B, L-1)
    logits = model(ids[:, :-1], valid=batch.valid[:, :-1])  # (B, L-1, V) causal
    ce = F.cross_entropy(logits.float().transpose(1, 2), ids[:, 1:], reduction="none")  # (B, L-1)
    loss = ((ce * tgt).sum(1) / tgt.sum(1).clamp_min(1)).mean()
    return LossOut(loss, int(tgt.sum()), int(batch.valid[:, :-1].sum()))


LossFn = Callable[[DiffusionLM, Batch, NoiseConfig, "torch.Generator | None"], LossOut]
OBJECTIVES: dict[
    str, tuple[LossFn, str, bool]
] = {  # name -> (loss, attention pattern, pad answers)
    "diffusion": (diffusion_loss, "block_causal", True),
    "diffusion_single": (diffusion_single_loss, "block_causal", True),
    "mdm": (mdm_loss, "bidirectional", True),
    "ar": (ar_loss, "causal", False),
}
