"""Held-out loss: a continuous quality measure for checkpoints too early to solve tasks.

Diffusion models: the block-diffusion SFT loss (no substitution noise) on a fixed, seeded batch of
test-split items with fixed noise draws, so two checkpoints see exactly the same masks. Causal
models: next-token cross-entropy on the same items' answers.
"""

from __future__ import annotations

import random

import torch

from ..models.transformer import Transformer
from ..suite.render import render
from ..suite.tasks import get_task
from ..tokenizer import Tokenizer
from .data import Example, collate
from .objective import NoiseConfig, ar_loss, diffusion_loss


@torch.no_grad()
def heldout_loss(
    model: Transformer,
    tokenizer: Tokenizer,
    tasks: list[str],
    n: int = 64,
    seed: int = 0,
    repeats: int = 4,
) -> float:
    """Mean loss over ``n`` test items per task (batches of 16), averaged over ``repeats`` noise draws."""
    was = model.training
    model.eval()
    rng = random.Random(f"heldout/{seed}")
    exs = []
    for name in tasks:
        for item in get_task(name).test_items(n, seed=seed + 99):
            p, a = render(item, tokenizer, instant=rng.random() < 0.15)
            if len(p) + len(a) <= model.config.max_seq_len - 32:
                exs.append(Example(p, a, name))
    causal = model.config.attention == "causal"
    cfg = NoiseConfig(model.config.mask_token_id, model.config.block_size)
    eot = tokenizer.eos_id if tokenizer.eos_id is not None else 1
    total, count = 0.0, 0
    for r in range(1 if causal else repeats):
        gen = torch.Generator().manual_seed(seed * 100 + r)
        for i in range(0, len(exs), 16):
            b = collate(
                exs[i : i + 16],
                model.config.block_size,
                tokenizer.pad_id or 0,
                eot,
                pad_answers=not causal,
            )
            out = (ar_loss if causal else diffusion_loss)(model, b, cfg, gen)
            total += float(out.loss) * len(exs[i : i + 16])
            count += len(exs[i : i + 16])
    model.train(was)
    return total / max(count, 1)
