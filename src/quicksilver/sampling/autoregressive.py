"""Autoregressive decoding with a KV cache: the baseline every speed claim is measured against.

The same network with ``attention="causal"`` (and no logit shift) predicts token j+1 from position j.
One forward pass per token after the prompt's prefill; stops at a stop token or ``max_new_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence

import torch

from ..errors import ConfigError
from ..models.host import to_device
from ..models.kvcache import KVCache
from ..models.segment import Segment
from ..models.transformer import DiffusionLM
from .decoder import DecodeResult
from .noise import sample_tokens
from .select import forbid_host, greedy_ids


@torch.no_grad()
def ar_stream(
    model: DiffusionLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> Generator[int, None, DecodeResult]:
    """Yield tokens one by one; return the DecodeResult (nfe counts the prefill too)."""
    cfg = model.config
    if cfg.attention != "causal":
        raise ConfigError(
            f"autoregressive decoding needs a causal model, this one is {cfg.attention}"
        )
    if len(prompt) + max_new_tokens > cfg.max_seq_len:
        raise ConfigError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds {cfg.max_seq_len}"
        )
    device = next(model.parameters()).device
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=device).manual_seed(seed if seed is not None else 0)
    t0 = time.perf_counter()
    cache = KVCache(model.kv_pool)
    x = torch.tensor(list(prompt), dtype=torch.long, device=device)  # (P,)
    start = 0  # absolute position of x[0]
    stops = set(stop_ids)
    out: list[int] = []
    nfe = 0
    finish = "length"
    try:
        for _ in range(max_new_tokens):
            T = int(
                x.shape[0]
            )  # the same packed path as diffusion decoding: one segment, exact cache
            logits = model.forward_segments([Segment(x, start, T - 1, T, cache, append=T)])[
                0
            ]  # (1, V): the next token
            nfe += 1
            logits = forbid_host(
                logits.float(), cfg.mask_token_id, None
            )  # the mask is never a prediction
            if temperature > 0:
                tok = int(sample_tokens(logits, temperature, top_p, gen)[0])
            else:
                tok = greedy_ids([logits])[0][0]  # numpy on the CPU, as verify's picks
            if tok in stops:
                finish = "stop"
                break
            out.append(tok)
            yield tok
            start += T
            x = to_device([tok], torch.long, device)  # (1,)
    finally:
        cache.release()
    return DecodeResult(out, finish, nfe, nfe, 0, time.perf_counter() - t0)


def ar_generate(
    model: DiffusionLM,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> DecodeResult:
    gen = ar_stream(model, prompt, max_new_tokens, stop_ids, temperature, top_p, seed)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            return stop.value
