"""One attention call per layer for a packed batch (the ``batched`` layout), exact batch invariance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.models.kvcache import KVCache
from quicksilver.runtime import Runtime, Segment
from quicksilver.runtime.packing import KEY_BUCKET, key_length
from quicksilver.sampling import Decoder
from test_step import _mixed, _prompt

MASK, EOS = 2, 1


def _model(attention: str, layout: str, **kw) -> Runtime:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    m = Transformer(preset("tiny", vocab_size=96, attention=attention, block_size=8, **kw)).eval()
    return Runtime(m, layout)


def _segments(cached: bool) -> list[Segment]:
    """Three rows of different lengths; with caches, each first runs a prefix into its cache."""
    torch.manual_seed(1)
    segs = []
    for n, pre in [(13, 8), (6, 0), (21, 16)]:
        ids = torch.randint(3, 96, (n,))
        if cached:
            segs.append(Segment(ids[pre:], pre, 0, n - pre, KVCache(), append=0))
            segs[-1].prefix = ids[:pre]  # type: ignore[attr-defined]
        else:
            segs.append(Segment(ids, 0, 2, n))
    return segs


@torch.no_grad()
def _run(m: Runtime, segs: list[Segment], cached: bool) -> list[torch.Tensor]:
    fresh = []
    for s in segs:
        cache = None
        if cached:
            cache = KVCache()
            pre = s.prefix  # type: ignore[attr-defined]
            if pre.numel():
                m.forward_segments([Segment(pre, 0, 0, 1, cache, append=int(pre.numel()))])
        fresh.append(Segment(s.ids, s.start, s.lo, s.hi, cache, 0))
    return m.forward_segments(fresh)


def rows_keep_their_bits() -> bool:
    """Whether this CPU's matmul gives a row the same bits whatever the row count (bit-exact batch
    invariance rests on it; AMX / oneDNN kernels pick their blocking by the row count)."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(172, 64, generator=g), torch.randn(100, 64, generator=g)
    return all(torch.equal(F.linear(x[:n], w), F.linear(x, w)[:n]) for n in (1, 9, 37))


BITWISE = rows_keep_their_bits()


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal", "causal"])
@pytest.mark.parametrize("cached", [False, True])
def test_a_row_of_a_batched_call_equals_it_alone_bit_for_bit(attention: str, cached: bool) -> None:
    if cached and attention == "bidirectional":
        pytest.skip(
            "bidirectional caches are refreshed, not appended (covered by the decoder test)"
        )
    m = _model(attention, "batched", logit_shift=attention == "bidirectional")
    segs = _segments(cached)
    together = _run(m, segs, cached)
    for i, s in enumerate(segs):
        alone = _run(m, [s], cached)[0]
        if BITWISE:
            assert torch.equal(together[i], alone)
        else:  # this CPU's matmul bits depend on the row count: the same numbers to rounding
            assert torch.allclose(together[i], alone, atol=1e-5, rtol=0)
    ref = _model(attention, "per_sequence", logit_shift=attention == "bidirectional")
    for a, b in zip(together, _run(ref, segs, cached)):  # the same numbers as per sequence
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("attention", ["block_causal", "causal"])
@pytest.mark.parametrize("cached", [False, True])
def test_rows_padded_to_different_key_lengths_batch_like_alone(
    attention: str, cached: bool
) -> None:
    """Rows whose keys fall in different buckets above 1,024 (alone, a short row pads its keys to
    512; beside a 1,300-token row, to 1,536): the padding never reaches a row's numbers."""
    m = _model(attention, "batched", max_seq_len=2048)
    torch.manual_seed(2)
    segs = []
    for n, pre in [(1300, 1290), (6, 0), (700, 690), (1100, 0)]:
        ids = torch.randint(3, 96, (n,))
        if cached:
            segs.append(Segment(ids[pre:], pre, 0, n - pre, KVCache(), append=0))
            segs[-1].prefix = ids[:pre]  # type: ignore[attr-defined]
        else:
            segs.append(Segment(ids, 0, n - 4, n))
    keys = {key_length(s.start + s.length, 2048) for s in segs}
    assert len(keys) >= 3 and max(keys) > 1024  # the rows really pad to different lengths
    together = _run(m, segs, cached)
    for i, s in enumerate(segs):
        alone = _run(m, [s], cached)[0]
        if BITWISE:
            assert torch.equal(together[i], alone)
        else:
            assert torch.allclose(together[i], alone, atol=1e-5, rtol=0)
    ref = _model(attention, "per_sequence", max_seq_len=2048)
    for a, b in zip(together, _run(ref, segs, cached)):
        assert torch.allclose(a, b, atol=1e-5)


def test_long_and_short_prompts_decode_together_as_alone() -> None:
    """Decoding with prompts of 5 to 1,200 tokens in one batch (keys padded per batch above
    1,024): every row's tokens and passes equal its decode alone."""
    dec = Decoder(_model("block_causal", "batched", max_seq_len=2048), MASK, [EOS], vocab_limit=96)
    prompts = [[3 + (5 * i + j) % 90 for j in range(n)] for i, n in enumerate((1200, 5, 800, 30))]
    cfgs = [_mixed(i).replace(temperature=0.0) for i in range(4)]
    together = dec.generate(prompts, cfgs)
    alone = [dec.generate([p], c)[0] for p, c in zip(prompts, cfgs)]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert [r.nfe for r in together] == [r.nfe for r in alone]


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_one_attention_call_per_layer_whatever_the_batch(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _model("block_causal", "batched")
    dec = Decoder(m, MASK, [EOS], vocab_limit=96)
    rows = [dec.new_row(_prompt(i), _mixed(i)) for i in range(batch)]
    calls = []
    orig = F.scaled_dot_product_attention

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return orig(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for _ in range(3):
        calls.clear()
        dec.step(rows)
        assert len(calls) == m.config.n_layers


@pytest.mark.parametrize(
    "attention,cache",
    [("block_causal", "auto"), ("bidirectional", "none"), ("bidirectional", "dual")],
)
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_layout_keeps_batch_invariance_in_decoding(
    attention: str, cache: str, temperature: float
) -> None:
    dec = Decoder(_model(attention, "batched"), MASK, [EOS], vocab_limit=96, cache_mode=cache)
    cfgs = [_mixed(i).replace(temperature=temperature) for i in range(5)]
    prompts = [_prompt(i) for i in range(5)]
    if not BITWISE and temperature > 0:
        pytest.skip("this CPU's matmul bits depend on the row count: a sampled draw may flip")
    together = dec.generate(prompts, cfgs)
    alone = [dec.generate([p], c)[0] for p, c in zip(prompts, cfgs)]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert [r.nfe for r in together] == [r.nfe for r in alone]


def test_key_axis_buckets() -> None:
    assert key_length(37, 384) == 384  # a short context: one bucket, the context
    assert key_length(37, 4096) == KEY_BUCKET
    assert key_length(700, 4096) == 2 * KEY_BUCKET
    assert key_length(1000, 1000) == 1000
    assert key_length(400, 1000) == KEY_BUCKET


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
def test_static_shapes_change_no_result(attention: str) -> None:
    """Packed tokens padded to a bucket (what CUDA graphs need) give the same tokens and logits."""
    plain = _model(attention, "batched")
    static = _model(attention, "batched")
    static.static_shapes = True
    segs = _segments(cached=False)
    for a, b in zip(_run(plain, segs, False), _run(static, segs, False)):
        assert torch.equal(a, b)
    cfgs = [_mixed(i) for i in range(4)]
    prompts = [_prompt(i) for i in range(4)]
    a = Decoder(plain, MASK, [EOS], vocab_limit=96).generate(prompts, cfgs)
    b = Decoder(static, MASK, [EOS], vocab_limit=96).generate(prompts, cfgs)
    assert [r.tokens for r in a] == [r.tokens for r in b]


def test_static_shapes_need_the_batched_layout() -> None:
    m = _model("block_causal", "batched")
    m.static_shapes = True
    with pytest.raises(ConfigError, match="batched"):
        m.set_attention_layout("per_sequence")
    with pytest.raises(ConfigError, match="layout"):
        m.set_attention_layout("ragged")


@pytest.mark.slow
def test_cuda_graph_build_compiled_equals_eager_at_temperature_zero() -> None:
    """``compile_static`` (reduce-overhead; on CPU it compiles without graphs): same tokens."""
    eager = _model("block_causal", "per_sequence")
    compiled = _model("block_causal", "per_sequence")
    compiled.compile_static()
    cfgs = [_mixed(i).replace(temperature=0.0) for i in range(3)]
    prompts = [_prompt(i) for i in range(3)]
    a = Decoder(eager, MASK, [EOS], vocab_limit=96).generate(prompts, cfgs)
    b = Decoder(compiled, MASK, [EOS], vocab_limit=96).generate(prompts, cfgs)
    assert [r.tokens for r in a] == [r.tokens for r in b]
