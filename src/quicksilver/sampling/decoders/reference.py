"""The reference decoder: slow and obviously correct, with the semantics of LLaDA's ``generate.py``.

The whole canvas (prompt + ``gen_length`` masks) goes through the network at every step; the canvas
is split into blocks decoded left to right, each with ``steps // num_blocks`` steps; at every step
the k most confident masked positions of the current block are committed, k from the fixed schedule
of ``num_transfer_tokens``. No cache, no early stop, no revision. The fast decoder must agree with it
where their semantics coincide (tests/test_decoder.py). Written from the published description of
the algorithm (ML-GSAI/LLaDA, generate.py); no code is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import ConfigError
from ...models.transformer import Transformer


@dataclass
class ReferenceResult:
    canvas: list[int]  # all gen_length generated tokens
    nfe: int


def num_transfer_tokens(n_masked: int, steps: int) -> list[int]:
    """Split n_masked into `steps` counts: n // steps each, the first n % steps get one more."""
    base, extra = divmod(n_masked, steps)
    return [base + (1 if i < extra else 0) for i in range(steps)]


def gumbel_perturb(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> torch.Tensor:
    """LLaDA's form of the Gumbel-max trick: exp(logits) / (-log u) ** T, in float64."""
    if temperature == 0:
        return logits
    logits = logits.double()
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    return logits.exp() / (-torch.log(u)) ** temperature


@torch.no_grad()
def reference_generate(
    model: Transformer,
    prompt: list[int],
    mask_id: int,
    gen_length: int = 128,
    steps: int = 128,
    block_length: int = 128,
    temperature: float = 0.0,
    remasking: str = "low_confidence",
    seed: int | None = None,
) -> ReferenceResult:
    if gen_length % block_length:
        raise ConfigError("reference decoder: gen_length must be a multiple of block_length")
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ConfigError("reference decoder: steps must be a multiple of the number of blocks")
    if remasking not in ("low_confidence", "random"):
        raise ConfigError(f"reference decoder: unknown remasking {remasking!r}")
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    P = len(prompt)
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[0, :P] = torch.tensor(prompt)
    steps_per_block = steps // num_blocks
    nfe = 0
    for b in range(num_blocks):
        lo, hi = P + b * block_length, P + (b + 1) * block_length
        schedule = num_transfer_tokens(int((x[0, lo:hi] == mask_id).sum()), steps_per_block)
        for i in range(steps_per_block):
            is_mask = x == mask_id  # (1, T)
            logits = model(x).float()  # (1, T, V): full forward, every step
            nfe += 1
            logits[..., mask_id] = float("-inf")
            x0 = gumbel_perturb(logits, temperature, gen).argmax(-1)  # (1, T)
            if remasking == "low_confidence":
                p = logits.softmax(-1)
                conf = p.gather(-1, x0[..., None]).squeeze(-1)  # (1, T)
            else:
                conf = torch.rand(x0.shape, generator=gen)
            conf[:, hi:] = float("-inf")
            x0 = torch.where(is_mask, x0, x)
            conf = torch.where(is_mask, conf, torch.tensor(float("-inf")))
            k = schedule[i]
            if k:
                idx = conf[0].topk(k).indices
                x[0, idx] = x0[0, idx]
    return ReferenceResult(x[0, P:].tolist(), nfe)
