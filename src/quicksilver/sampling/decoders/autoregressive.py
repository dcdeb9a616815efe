"""Autoregressive decoding with a KV cache: the baseline every speed claim is measured against.

Plain AR decoding is verify decoding without drafts (``draft = 0``, sampling/decoders/verify.py): one
cached pass per token, the causal argmax (or a draw at the request's temperature and top_p), the
same packed forward pass and picks as every other row. These helpers stream one prompt through it
token by token; there is no second AR loop.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

from ...models.transformer import Transformer
from ...runtime import Runtime
from ..core.config import SamplerConfig
from ..core.state import DecodeResult
from .verify import VerifyDecoder


def ar_stream(
    model: Transformer | Runtime,
    prompt: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
) -> Generator[int, None, DecodeResult]:
    """Yield tokens one by one; return the DecodeResult (nfe counts the prompt's pass too)."""
    cfg = SamplerConfig(
        max_new_tokens=max_new_tokens,
        policy="verify",
        draft=0,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )
    drive = VerifyDecoder(model, stop_ids).run([list(prompt)], cfg)
    emitted = 0
    while True:
        try:
            events = next(drive)
        except StopIteration as stop:
            return stop.value[0]
        for ev in events:
            yield from ev.row.host_tokens[emitted:]
            emitted = len(ev.row.host_tokens)


def ar_generate(
    model: Transformer | Runtime,
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
