"""The flex attention layout over the paged KV pool (runtime/paged.py): equal to the SDPA layouts for
every mask pattern, batch-invariant, one attention call per layer, a pool that allocates, frees,
grows and moves caches in.

Tolerances: flex (eager, the unfused reference on the CPU) against per-sequence SDPA in float32,
logits within 1e-5 absolute (measured ~1e-7); greedy tokens equal; a row's logits in a batch
bit-equal to the row alone (flex itself: other rows' pages are masked no-ops)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from quicksilver.models.kvcache import KVCache
from quicksilver.models.masks import build_attention_mask
from quicksilver.runtime import Runtime, Segment, paged, runtime
from quicksilver.runtime.paged import PAGE, PagedPool, Row, plan_flex
from quicksilver.sampling import Decoder, SamplerConfig
from quicksilver.sampling.decoders.verify import VerifyDecoder
from test_packing import BITWISE, _model, _run, _segments
from test_step import _mixed, _prompt

MASK, EOS = 2, 1
ATOL = 1e-5


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal", "causal"])
@pytest.mark.parametrize("cached", [False, True])
def test_flex_equals_per_sequence_sdpa_for_every_pattern(attention: str, cached: bool) -> None:
    shift = attention == "bidirectional"
    segs = _segments(cached)
    ref = _run(_model(attention, "per_sequence", logit_shift=shift), segs, cached)
    got = _run(_model(attention, "flex", logit_shift=shift), segs, cached)
    for a, b in zip(ref, got):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=ATOL, rtol=0)


@torch.no_grad()
def _cached_pass(m: Runtime, rows: list[int]) -> list[torch.Tensor]:
    """A prompt per row into its cache, then causal: a pass of 3 stream tokens + a draft block of
    4 (the verify layout); bidirectional: a dual-cache pass overwriting 3 cached positions."""
    segs = []
    for i in rows:
        g = torch.Generator().manual_seed(i)
        n = 9 + 5 * i
        ids = torch.randint(3, 96, (n + 7,), generator=g)
        cache = KVCache(m.kv_pool)
        m.forward_segments([Segment(ids[:n], 0, 0, 1, cache, append=n)])
        if m.config.attention == "causal":
            segs.append(Segment(ids[n:], n, 0, 7, cache, append=3, draft=4))
        else:
            segs.append(Segment(ids[n - 3 : n], n - 3, 0, 3, cache, overwrite=True))
    return m.forward_segments(segs)


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
def test_flex_equals_sdpa_for_the_verify_draft_block_and_dual_overwrite(attention: str) -> None:
    ref = _cached_pass(_model(attention, "per_sequence"), [0, 1, 2])
    got = _cached_pass(_model(attention, "flex"), [0, 1, 2])
    for a, b in zip(ref, got):
        assert torch.allclose(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal", "causal"])
@pytest.mark.parametrize("cached", [False, True])
def test_a_row_under_flex_equals_it_alone(attention: str, cached: bool) -> None:
    m = _model(attention, "flex", logit_shift=attention == "bidirectional")
    segs = _segments(cached)
    together = _run(m, segs, cached)
    for i, s in enumerate(segs):
        alone = _run(m, [s], cached)[0]
        if BITWISE:
            assert torch.equal(together[i], alone)
        else:
            assert torch.allclose(together[i], alone, atol=ATOL, rtol=0)


@pytest.mark.slow  # eager FlexAttention decodes at ~0.1 s a layer call on the CPU
@pytest.mark.parametrize("attention,cache", [("block_causal", "auto"), ("bidirectional", "dual")])
def test_flex_decodes_the_same_tokens_alone_and_together(attention: str, cache: str) -> None:
    cfgs = [_mixed(i).replace(temperature=0.0, max_new_tokens=12) for i in range(2)]
    prompts = [_prompt(i) for i in range(2)]
    flex = Decoder(_model(attention, "flex"), MASK, [EOS], vocab_limit=96, cache_mode=cache)
    ref = Decoder(_model(attention, "per_sequence"), MASK, [EOS], vocab_limit=96, cache_mode=cache)
    together = flex.generate(prompts, cfgs)
    assert [r.tokens for r in together] == [r.tokens for r in ref.generate(prompts, cfgs)]
    alone = [flex.generate([p], c)[0] for p, c in zip(prompts, cfgs)]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert flex.runtime.kv_pool.live_slots() == 0  # type: ignore[union-attr]  # all given back


@pytest.mark.slow  # as above
def test_verify_decoding_under_flex_equals_sdpa() -> None:
    sc = SamplerConfig(max_new_tokens=16, temperature=0.0, stop_at_eos=False, draft=4)
    prompts = [_prompt(i) for i in range(2)]
    ref = VerifyDecoder(_model("causal", "per_sequence"), [EOS], 96).generate(prompts, sc)
    got = VerifyDecoder(_model("causal", "flex"), [EOS], 96).generate(prompts, sc)
    assert [r.tokens for r in got] == [r.tokens for r in ref]


def test_one_flex_call_per_layer_and_no_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _model("block_causal", "flex")
    dec = Decoder(m, MASK, [EOS], vocab_limit=96)
    rows = [dec.new_row(_prompt(i), _mixed(i)) for i in range(5)]
    calls: list[str] = []
    orig = paged.flex_attention

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append("flex")
        return orig(*a, **kw)

    monkeypatch.setattr(runtime, "flex_kernel", lambda _: spy)
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append("sdpa"))
    for _ in range(3):
        calls.clear()
        dec.step(rows)
        assert calls == ["flex"] * m.config.n_layers


def _mask_from_mod(rows: list[Row], pool: PagedPool, pattern: str) -> torch.Tensor:
    """The dense mask (Tq, slots) that a step's ``mask_mod`` gives."""
    n = max(r.span[1] for r in rows)
    flex = plan_flex(pool, rows, n, pattern, 8, torch.device("cpu"))
    mod = flex.block_mask.mask_mod
    q = torch.arange(n)[:, None]
    kv = torch.arange(pool.slots)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    return mod(zero, zero, q, kv)


@pytest.mark.parametrize("pattern", ["bidirectional", "block_causal", "causal"])
def test_mask_mod_is_the_network_rule(pattern: str) -> None:
    """Over each row's span of the pool, ``mask_mod`` equals ``build_attention_mask`` (with the
    draft block for causal rows); outside it, nothing is visible."""
    pool = PagedPool(1, 1, 4, torch.float32, torch.device("cpu"), pages=8)
    rows, caches, a = [], [], 0
    for L, T in [(20, 7), (0, 5), (40, 9)]:
        c = KVCache(pool)
        c.reserve(1, 1, 1, 4, L + T, torch.float32, torch.device("cpu"))
        c.write_meta(torch.arange(L + T)[None], None)
        c.commit(L + T)
        caches.append(c)  # keeps the span alive
        off = c.offset
        assert off is not None and off % PAGE == 0
        draft = L + T - 3 if pattern == "causal" else None
        rows.append(Row((a, a + T), L, off + L, off, off + L + T, draft))
        a += T
    dense = _mask_from_mod(rows, pool, pattern)
    for r in rows:
        (qa, qb), T = r.span, r.span[1] - r.span[0]
        q_pos = torch.arange(r.start, r.start + T)[None]
        k_pos = torch.arange(r.hi - r.lo)[None]
        draft = None if r.draft_from is None else torch.tensor([r.draft_from])
        want = build_attention_mask(pattern, 8, q_pos, k_pos, None, draft)[0, 0]
        assert torch.equal(dense[qa:qb, r.lo : r.hi], want)
        assert not dense[qa:qb, : r.lo].any() and not dense[qa:qb, r.hi :].any()


def test_noise_canvas_pattern_is_a_sliding_floor() -> None:
    """DiffusionGemma's decoder pass: a canvas sees the whole canvas and, on sliding layers, the
    last ``window - 1`` cached positions: flex with a floor equals SDPA over those keys."""
    g = torch.Generator().manual_seed(0)
    L, C, W, H, hd = 50, 12, 16, 2, 8
    pool = PagedPool(1, H, hd, torch.float32, torch.device("cpu"), pages=4)
    cache = KVCache(pool)
    cache.reserve(1, 1, H, hd, L + C, torch.float32, torch.device("cpu"))
    cache.write_meta(torch.arange(L + C)[None], None)
    k = torch.randn(1, H, L + C, hd, generator=g)
    v = torch.randn(1, H, L + C, hd, generator=g)
    q = torch.randn(1, H, C, hd, generator=g)
    off = cache.offset
    assert off is not None
    row = Row((0, C), L, off + L, off, off + L + C, None, floor=L - (W - 1))
    flex = plan_flex(pool, [row], C, "bidirectional", 1, torch.device("cpu"))
    cache.k[0][:, :, :L] = k[:, :, :L]
    cache.v[0][:, :, :L] = v[:, :, :L]
    got = flex.attend(None, q, k[:, :, L:], v[:, :, L:], 0)
    lo = L - (W - 1)
    want = F.scaled_dot_product_attention(q, k[:, :, lo:], v[:, :, lo:])
    assert torch.allclose(got, want, atol=ATOL, rtol=0)


def test_the_pool_allocates_frees_grows_and_moves_caches_in() -> None:
    cpu = torch.device("cpu")
    pool = PagedPool(2, 1, 4, torch.float32, cpu, pages=4)
    a, b = KVCache(pool), KVCache(pool)
    a.reserve(2, 1, 1, 4, 100, torch.float32, cpu)  # 128 slots: 2 pages
    b.reserve(2, 1, 1, 4, 10, torch.float32, cpu)  # 64 slots: 1 page
    assert {a.offset, b.offset} == {0, 2 * PAGE} and pool.pages == 4
    a.k[1][0, 0, 5] = 7.0
    a.positions[0, 5] = 5  # type: ignore[index]
    c = KVCache(pool)
    c.reserve(2, 1, 1, 4, 200, torch.float32, cpu)  # 256 slots: the pool doubles
    assert pool.pages == 8 and c.offset == 4 * PAGE
    assert a.k[1][0, 0, 5, 0] == 7.0 and a.kv is not None  # repointed into the new buffer
    assert a.kv.data_ptr() == pool.kv.data_ptr()
    b.release()
    a.release()
    c.release()
    assert pool.live_slots() == 0 and {s: f for s, f in pool._free.items() if f} == {
        8: {0}
    }  # every buddy joined again
    own = KVCache()  # a cache with memory of its own moves in, committed part kept
    own.reserve(2, 1, 1, 4, 30, torch.float32, cpu)
    own.write_meta(torch.arange(30)[None], None)
    own.k[0][0, 0, :30] = 1.5
    own.commit(30)
    own.move_to(pool)
    assert own.offset == 0 and own.length == 30
    assert bool((own.k[0][0, 0, :30] == 1.5).all()) and int(own.positions[0, 29]) == 29  # type: ignore[index]


@pytest.mark.slow  # compiles the whole step on the CPU: ~2.5 min of inductor (make test-slow)
def test_a_captured_flex_step_equals_eager() -> None:
    """``compile_step`` (``compile_static`` under flex): the network, the pool writes, the block
    mask and FlexAttention as one ``torch.compile(mode="reduce-overhead")`` function (CUDA graphs
    on a GPU; compiled without them here) gives the eager flex layout's tokens, one graph per
    bucket of packed tokens."""
    from torch._dynamo.utils import counters

    cfgs = [_mixed(i).replace(temperature=0.0, max_new_tokens=12) for i in range(2)]
    prompts = [_prompt(i) for i in range(2)]
    eager = Decoder(_model("block_causal", "flex"), MASK, [EOS], vocab_limit=96).generate(
        prompts, cfgs
    )
    m = _model("block_causal", "flex")
    m.compile_static()
    assert m.captured_step is not None and m.static_shapes and m.kv_pool.static  # type: ignore[union-attr]
    before = counters["stats"]["unique_graphs"]
    dec = Decoder(m, MASK, [EOS], vocab_limit=96)
    for _ in range(2):  # the second run replays what the first compiled
        got = dec.generate(prompts, cfgs)
        assert [r.tokens for r in got] == [r.tokens for r in eager]
    assert counters["stats"]["unique_graphs"] - before <= 2  # the prompt's bucket, the steps'
