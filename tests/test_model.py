"""The generic transformer: attention patterns, GQA, logit shift, packed == padded, exact block cache."""

from __future__ import annotations

import pytest
import torch

from quicksilver.errors import ConfigError
from quicksilver.models import KVCache, ModelConfig, Transformer, preset
from quicksilver.runtime import Runtime, Segment


def _model(**kw) -> Transformer:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=96, **kw)).eval()


@torch.no_grad()
def test_block_causal_prefix_of_whole_blocks_ignores_later_blocks() -> None:
    m = _model(attention="block_causal", block_size=4)
    x = torch.randint(3, 96, (1, 16))
    y = x.clone()
    y[0, 8:] = torch.randint(3, 96, (8,))  # change blocks 2 and 3
    a, b = m(x), m(y)
    assert torch.allclose(a[0, :8], b[0, :8], atol=1e-6)  # blocks 0-1 unaffected
    assert not torch.allclose(a[0, 8:], b[0, 8:], atol=1e-3)
    z = x.clone()
    z[0, 7] = (
        z[0, 7] + 1
    ) % 96  # change inside block 1: block 1 itself sees it (bidirectional within)
    assert not torch.allclose(m(z)[0, 4:7], a[0, 4:7], atol=1e-6)


@torch.no_grad()
def test_bidirectional_sees_the_future_and_causal_does_not() -> None:
    x = torch.randint(3, 96, (1, 12))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 5) % 96
    bi, ca = _model(attention="bidirectional"), _model(attention="causal")
    assert not torch.allclose(bi(x)[0, 0], bi(y)[0, 0], atol=1e-6)
    assert torch.allclose(ca(x)[0, :-1], ca(y)[0, :-1], atol=1e-6)


@torch.no_grad()
def test_logit_shift_moves_predictions_one_position() -> None:
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=96)
    plain = Transformer(cfg).eval()
    shifted = Transformer(ModelConfig(**{**cfg.to_dict(), "logit_shift": True})).eval()
    shifted.load_state_dict(plain.state_dict())
    x = torch.randint(3, 96, (2, 10))
    a, b = plain(x), shifted(x)
    assert torch.equal(b[:, 1:], a[:, :-1]) and torch.equal(b[:, 0], a[:, 0])


def test_gqa_shapes_and_bad_configs() -> None:
    m = _model(n_heads=4, n_kv_heads=1)
    assert m.model.layers[0].self_attn.k_proj.weight.shape[0] == m.config.dim_head
    assert m(torch.randint(3, 96, (2, 5))).shape == (2, 5, 96)
    with pytest.raises(ConfigError):
        preset("tiny", vocab_size=96, n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError):
        preset("tiny", vocab_size=96, attention="sideways")
    with pytest.raises(ConfigError):
        preset("nope")


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal", "causal"])
@pytest.mark.parametrize("shift", [False, True])
@torch.no_grad()
def test_packed_segments_equal_padded_forward(attention: str, shift: bool) -> None:
    m = _model(attention=attention, block_size=4, logit_shift=shift)
    a, b = torch.randint(3, 96, (11,)), torch.randint(3, 96, (6,))
    outs = Runtime(m).forward_segments([Segment(a, 0, 0, 11), Segment(b, 0, 2, 6)])
    assert torch.allclose(outs[0], m(a[None])[0], atol=1e-5)
    assert torch.allclose(outs[1], m(b[None])[0, 2:6], atol=1e-5)


@pytest.mark.parametrize("shift", [False, True])
@torch.no_grad()
def test_block_cache_is_exact(shift: bool) -> None:
    """Prefill whole blocks into the cache, then forward later blocks against it == full forward."""
    m = _model(attention="block_causal", block_size=4, logit_shift=shift)
    x = torch.randint(3, 96, (14,))
    full = m(x[None])[0]  # (14, V)
    cache, rt = KVCache(), Runtime(m)
    first = rt.forward_segments([Segment(x[:8], 0, 0, 8, cache, append=8)])[0]
    assert cache.length == 8 and torch.allclose(first, full[:8], atol=1e-5)
    rest = rt.forward_segments([Segment(x[8:], 8, 0, 6, cache, append=4)])[0]
    assert cache.length == 12 and torch.allclose(rest, full[8:], atol=1e-5)
    assert cache.nbytes() > 0


@pytest.mark.slow
@torch.no_grad()
def test_compiled_equals_eager_at_temperature_zero() -> None:
    from quicksilver.sampling import Decoder, SamplerConfig

    eager = _model(attention="block_causal", block_size=8)
    compiled = Runtime(_model(attention="block_causal", block_size=8))
    compiled.compile_blocks()
    cfg = SamplerConfig(max_new_tokens=24, policy="threshold", threshold=0.3, stop_at_eos=False)
    a = Decoder(eager, 2, [1], vocab_limit=96).generate([list(range(10, 30))], cfg)[0]
    b = Decoder(compiled, 2, [1], vocab_limit=96).generate([list(range(10, 30))], cfg)[0]
    assert a.tokens == b.tokens
