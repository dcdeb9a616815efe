"""The decoders, one algorithm a file, and the factory that picks the one a model runs under.

- ``row_decoder.py``: the contract every decoder implements (a row per request, one forward pass
  per ``step``) and the loop they share (``drive``, ``generate``).
- ``diffusion.py``: ``Decoder``, parallel refinement of masked canvases (bidirectional and
  block-causal models), with cache modes, revision, editing and constrained rows.
- ``verify.py``: ``VerifyDecoder``, causal models drafting by diffusion and verifying in one pass;
  ``copy_drafts.py``: its drafts copied from the row's own context.
- ``autoregressive.py``: plain AR decoding (verify without drafts), the speed baseline.
- ``reference.py``: LLaDA's slow, obviously correct sampler the fast one is tested against.
- ``noise_canvas.py``: DiffusionGemma's generation loop (uniform-noise canvases);
  ``noise_decoder.py``: ``NoiseCanvasDecoder``, that loop behind the one decoder contract.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...models.transformer import Transformer
from ...runtime import Runtime
from .diffusion import Decoder
from .verify import VerifyDecoder

__all__ = ["Decoder", "VerifyDecoder", "decoder_for"]


def decoder_for(
    model: Runtime | Transformer,
    stop_ids: Sequence[int],
    pad_id: int = 0,
    vocab_limit: int | None = None,
    cache_mode: str = "auto",
    refresh_every: int = 0,
) -> Decoder | VerifyDecoder:
    """The decoder a model runs under: ``VerifyDecoder`` for causal models, else ``Decoder``."""
    if model.config.attention == "causal" and not model.config.logit_shift:
        return VerifyDecoder(model, stop_ids, vocab_limit)
    return Decoder(
        model,
        model.config.mask_token_id,
        stop_ids,
        pad_id=pad_id,
        vocab_limit=vocab_limit,
        cache_mode=cache_mode,
        refresh_every=refresh_every,
    )
