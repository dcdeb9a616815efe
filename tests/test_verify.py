"""Verify decoding: the draft-block layout, exactness against AR decoding, the p/q sampler."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from quicksilver.errors import ConfigError
from quicksilver.models.config import ModelConfig, preset
from quicksilver.models.kvcache import KVCache
from quicksilver.models.transformer import Transformer
from quicksilver.runtime.cpu_backends import TOKEN_BUCKETS, attach_backend, step_buckets
from quicksilver.runtime.pass_plan import RUNTIMES, PassPlanner, PassPolicy
from quicksilver.runtime.runtime import Runtime
from quicksilver.runtime.segment import Segment
from quicksilver.sampling import SamplerConfig
from quicksilver.sampling.decoders.autoregressive import ar_generate
from quicksilver.sampling.decoders.verify import VerifyDecoder, VerifyRow
from quicksilver.train.objective import draft_mask

MASK = 2


@pytest.fixture(autouse=True)
def _inference() -> object:
    with torch.no_grad():
        yield


def causal_model(seed: int = 0, vocab: int = 384, **kw: object) -> Transformer:
    torch.manual_seed(seed)
    cfg = preset("tiny", vocab_size=vocab, attention="causal", mask_token_id=MASK, **kw)
    return Transformer(cfg).eval()


def prompts(n: int, vocab: int = 384, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(5, vocab, (int(3 + 7 * i) % 23 + 4,), generator=g).tolist() for i in range(n)
    ]


def explicit(model: Transformer, stream: list[int], k: int) -> torch.Tensor:
    """Logits (P + k, V) of stream + k masks through the padded path and the training mask."""
    P = len(stream)
    ids = torch.tensor([stream + [MASK] * k])
    pos = torch.arange(P + k)[None]
    m = draft_mask(P, torch.tensor([[P - 1]]), k, torch.ones(1, P, dtype=torch.bool))
    return model(ids, positions=pos, attn_mask=m, raw=True)[0]


@pytest.mark.parametrize("layout", ["per_sequence", "batched", "flex"])
def test_draft_block_layout_matches_the_training_mask(layout: str) -> None:
    model = causal_model()
    rt = Runtime(model, layout)
    streams = prompts(3)
    segs, caches = [], []
    for s in streams:  # a cached prefix, then stream tail + 5 masks in one segment
        cache = KVCache()
        rt.forward_segments([Segment(torch.tensor(s[:3]), 0, 2, 3, cache, append=3)])
        tail = torch.tensor(s[3:] + [MASK] * 5)
        segs.append(Segment(tail, 3, 0, len(tail), cache, append=len(s) - 3, draft=5))
        caches.append(cache)
    with torch.no_grad():
        out = rt.forward_segments(segs)
    for s, o, cache in zip(streams, out, caches):
        ref = explicit(model, s, 5)[3:]
        assert torch.allclose(o, ref, atol=1e-5), (o - ref).abs().max()
        assert cache.length == len(s)  # masks never enter the cache


def test_stream_never_sees_the_draft_block() -> None:
    model = causal_model()
    s = prompts(1)[0]
    plain = model(torch.tensor([s]))[0]
    with_block = explicit(model, s, 7)[: len(s)]
    assert torch.allclose(plain, with_block, atol=1e-5)


def uncached_greedy(model: Transformer, prompt: list[int], n: int, stops: list[int]) -> list[int]:
    """The obviously correct AR loop: the whole sequence through the padded path at every token,
    no cache, the argmax of the last position (never the mask)."""
    seq, out = list(prompt), []
    for _ in range(n):
        logits = model(torch.tensor([seq]))[0, -1].float()  # (V,)
        logits[model.config.mask_token_id] = float("-inf")
        tok = int(logits.argmax())
        if tok in stops:
            break
        out.append(tok)
        seq.append(tok)
    return out


def test_plain_ar_is_the_uncached_argmax() -> None:
    """``draft = 0`` (``ar_generate``), the plain AR path every verify test compares against,
    equals the uncached loop token for token."""
    model = causal_model(seed=3)
    for p in prompts(3):
        assert ar_generate(model, p, 24, [1]).tokens == uncached_greedy(model, p, 24, [1])


def rows_equal_ar(model: Transformer | Runtime, ps: list[list[int]], k: int, n: int = 40) -> None:
    dec = VerifyDecoder(model, [1])
    runs = [ar_generate(model, p, n, [1]) for p in ps]
    alone = [
        dec.generate([p], SamplerConfig(max_new_tokens=n, policy="verify", draft=k))[0] for p in ps
    ]
    batched = dec.generate(ps, SamplerConfig(max_new_tokens=n, policy="verify", draft=k))
    assert all(r.nfe == len(r.tokens) + (r.finish_reason == "stop") for r in runs)  # one a pass
    ar = [r.tokens for r in runs]
    assert [r.tokens for r in alone] == ar
    assert [r.tokens for r in batched] == ar


CPU, CPU_EXPORTED = RUNTIMES["cpu"], RUNTIMES["cpu-exported"]
MIN_MASKS = CPU_EXPORTED.min_masks


@pytest.mark.parametrize("gate", [0.0, CPU.mask_gate])  # 0: masks behind every draft block
@pytest.mark.parametrize("layout", ["per_sequence", "batched"])
def test_garbage_drafts_still_give_the_ar_output(
    layout: str, gate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(RUNTIMES, "cpu", PassPolicy(mask_gate=gate))
    rows_equal_ar(Runtime(causal_model(seed=3), layout), prompts(5), k=6)


def test_one_pass_shape_on_an_exported_step_still_gives_the_ar_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone row on an exported step feeds 1 + k positions a pass after its prompt (drafts
    trimmed, masks in the rest), and its output is the same weights' AR output there."""
    monkeypatch.setitem(RUNTIMES, "cpu", PassPolicy(mask_gate=0.0))  # else every block gets k masks
    model, k = Runtime(causal_model(seed=3)), 6
    attach_backend(model, "onnx")
    shapes: list[tuple[int, int]] = []
    forward = model.forward_segments

    def record(segs: list[Segment]) -> list[torch.Tensor]:
        shapes.extend((s.length, s.draft) for s in segs)
        return forward(segs)

    model.forward_segments = record  # type: ignore[method-assign]
    try:
        for p in prompts(4):
            shapes.clear()
            want = ar_generate(model, p, 40, [1]).tokens
            cfg = SamplerConfig(max_new_tokens=40, policy="verify", draft=k, copy_drafts=False)
            got = VerifyDecoder(model, [1]).generate([p], cfg)[0]
            assert got.tokens == want
            decode = shapes[len(shapes) - got.nfe + 1 :]  # after the prompt pass
            assert decode and all(n <= 1 + k for n, _ in decode)
            assert any(0 < m < k for _, m in decode)  # drafts and masks share a pass
    finally:
        attach_backend(model, "torch")


def test_perfect_drafts_are_all_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """An oracle that drafts the AR continuation: every draft kept, k + 1 tokens per pass."""
    model, k, n = causal_model(seed=4), 4, 30
    p = prompts(1)[0]
    want = ar_generate(model, p, n, []).tokens
    finish = VerifyRow.finish

    def oracle(self, new, kept, drafts, q, conf):  # type: ignore[no-untyped-def]
        at = len(self.host_tokens) + len(new)
        return finish(self, new, kept, want[at : at + len(drafts)], q, [1.0] * len(drafts))

    monkeypatch.setattr(VerifyRow, "finish", oracle)
    res = VerifyDecoder(model, []).generate(
        [p],
        SamplerConfig(
            max_new_tokens=n, policy="verify", draft=k, stop_at_eos=False, copy_drafts=False
        ),
    )[0]
    assert res.tokens == want
    assert res.nfe == 1 + math.ceil((n - 1) / (k + 1))  # the first pass has nothing to verify


def test_masks_never_move_a_prefill_into_a_larger_bucket() -> None:
    """In shape buckets a prompt of 25 tokens + 8 masks would compute 64 positions, not 32: the
    first pass drafts only the 7 that fit; steady passes (1 + 8, 9 + 8) keep all k."""
    buckets = step_buckets(8)
    padded = lambda n, unread=0: next(b for b in buckets if b >= n)  # noqa: E731
    model = Runtime(causal_model(seed=6))
    dec = VerifyDecoder(model, [])
    cfg = SamplerConfig(max_new_tokens=40, policy="verify", draft=8)
    bucketed = PassPlanner(CPU, padded)
    row = dec.new_row(list(range(5, 30)), cfg)
    assert row.segment(bucketed).draft == 7  # 25 + 7 = 32
    assert row.segment(PassPlanner(CPU)).draft == 8  # exact shapes: every mask
    row.cache.length, row.host_tokens = 25, [9]  # the bonus is the whole feed
    assert row.segment(bucketed).draft == 8
    row.drafts, row.conf = [9] * 8, [1.0] * 8
    assert row.segment(bucketed).draft == 8


def test_first_pass_masks_follow_the_exported_steps_cost() -> None:
    """With the exported step, whose prompts run as whole-bucket chunks: the masks may not be
    chunked off with the prompt, so 25 + 8 would cost a second pass and 25 + 7 fills the 32
    shape; a 70-token prompt (64 + 6 in the 8 shape) takes all 8 (64 + 14 in the 16 shape)."""
    model = Runtime(causal_model(seed=6))
    dec = VerifyDecoder(model, [])
    cfg = SamplerConfig(max_new_tokens=40, policy="verify", draft=8)
    attach_backend(model, "onnx")
    try:
        planner = PassPlanner(CPU, model.pass_cost)
        assert dec.new_row(list(range(5, 30)), cfg).segment(planner).draft == 7
        assert dec.new_row(list(range(5, 75)), cfg).segment(planner).draft == 8
    finally:
        attach_backend(model, "torch")


def test_drafts_unlikely_to_be_all_kept_get_no_masks() -> None:
    """Masks behind drafts whose own probabilities multiply to under the mask gate would almost
    surely be void: that pass checks the drafts alone (n + 1 positions, not n + 1 + k)."""
    dec = VerifyDecoder(causal_model(seed=6), [])
    row = dec.new_row(
        list(range(5, 30)), SamplerConfig(max_new_tokens=40, policy="verify", draft=8)
    )
    row.cache.length, row.host_tokens, row.drafts = 25, [9], [9] * 8
    cpu = PassPlanner(CPU)
    row.conf = [0.99] * 8  # 0.92 all kept
    assert row.segment(cpu).draft == 8 and row.wide == 1  # a wide pass: drafts and masks
    row.conf = [0.99] * 7 + [0.5]  # 0.47
    seg = row.segment(cpu)
    assert seg.draft == 0 and seg.length == 1 + 8 and row.wide == 1
    row.drafts, row.conf = [], []  # the bonus and k masks: 1 + k positions, not wide
    assert row.segment(cpu).draft == 8 and row.wide == 1
    assert row.result().wide_passes == 1


def test_a_pass_of_width_k_feeds_the_likely_drafts_then_masks() -> None:
    """On one pass shape a pass feeds k positions after its final token: the draft prefix whose
    own probabilities multiply to at least ``draft_odds`` (at most k - ``min_masks``), masks in
    the rest."""
    dec = VerifyDecoder(causal_model(seed=6), [])
    row = dec.new_row(
        list(range(5, 30)), SamplerConfig(max_new_tokens=40, policy="verify", draft=8)
    )
    row.cache.length, row.host_tokens = 25, [9]
    for conf, fed in (
        ([0.99] * 8, 8 - MIN_MASKS),
        ([0.9, 0.8, 0.3] + [0.99] * 5, 2),
        ([0.1] * 8, 1),
    ):
        row.drafts, row.conf, row.q = [9] * 8, conf, torch.rand(8, 16)
        seg = row.segment(PassPlanner(CPU_EXPORTED))
        assert len(row.drafts) == len(row.conf) == len(row.q) == fed
        assert seg.length == 1 + 8 and seg.draft == 8 - fed  # one shape: 1 + k
    row.drafts, row.conf, row.q = [], [], None  # the bonus and k masks
    assert row.segment(PassPlanner(CPU_EXPORTED)).draft == 8
    assert row.wide == row.result().wide_passes == 0  # never more than 1 + k positions


def test_fit_drafts_takes_the_likely_prefix() -> None:
    fit_drafts = PassPlanner(CPU_EXPORTED).fit_drafts
    assert fit_drafts([0.99] * 8, 8) == 8 - MIN_MASKS
    assert fit_drafts([0.9, 0.5, 0.9], 8) == 3  # 0.9, 0.45, 0.405: all at least 0.3
    assert fit_drafts([0.9, 0.3], 8) == 1  # 0.27 < 0.3
    assert fit_drafts([0.01], 8) == 1  # never none: the first draft is always fed
    assert fit_drafts([0.99] * 3, 2) == 1


def test_a_drafting_model_gets_buckets_for_both_verify_passes() -> None:
    assert {7, 13} <= set(step_buckets(6)) and set(step_buckets(0)) == set(TOKEN_BUCKETS)


def test_stop_tokens_end_the_reply() -> None:
    model = causal_model(seed=5)
    p = prompts(1)[0]
    cfg = SamplerConfig(max_new_tokens=12, policy="verify", draft=3)
    free = VerifyDecoder(model, []).generate([p], cfg)[0].tokens
    stop = free[4]
    res = VerifyDecoder(model, [stop]).generate([p], cfg)[0]
    assert res.finish_reason == "stop" and res.tokens == free[: free.index(stop)]


def test_prefill_is_forced() -> None:
    model = causal_model(seed=5)
    p = prompts(1)[0]
    dec = VerifyDecoder(model, [])
    cfg = SamplerConfig(max_new_tokens=10, policy="verify", draft=3)
    row = dec.new_row(p, cfg, prefill={0: 7, 1: 9, 5: 11})
    gen = dec.drive([row])
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            toks = stop.value[0].tokens
            break
    ar = ar_generate(model, p + [7, 9], 3, []).tokens
    assert toks[:2] == [7, 9] and toks[5] == 11 and toks[2:5] == ar


def test_verify_refuses_what_it_cannot_do() -> None:
    model = causal_model()
    dec = VerifyDecoder(model, [])
    with pytest.raises(ConfigError, match="suffix"):
        dec.new_row([5, 6], SamplerConfig(max_new_tokens=4, policy="verify"), suffix=[7])
    with pytest.raises(ConfigError, match="policy"):
        dec.new_row([5, 6], SamplerConfig(max_new_tokens=4, policy="low_confidence"))
    with pytest.raises(ConfigError, match="draft"):
        SamplerConfig(draft=-1).validate()
    with pytest.raises(ConfigError):
        VerifyDecoder(Transformer(preset("tiny", vocab_size=64, attention="block_causal")), [])
    with pytest.raises(ConfigError, match="draft_length"):
        ModelConfig(attention="block_causal", draft_length=4)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_drafts_carry_their_own_probabilities() -> None:
    """A sampled row's next drafts come with q_j(d_j): the mask gate reads them as a greedy row's."""
    dec = VerifyDecoder(causal_model(seed=7), [])
    cfg = SamplerConfig(max_new_tokens=30, policy="verify", draft=4, temperature=0.8, seed=1)
    row = dec.new_row(prompts(1)[0], cfg.replace(stop_at_eos=False))
    dec.step([row])  # the prompt's pass drafts 4
    assert row.q is not None and len(row.drafts) == 4
    assert row.conf == pytest.approx([float(row.q[j, d]) for j, d in enumerate(row.drafts)])


def test_sampled_verify_follows_the_ar_distribution() -> None:
    """The joint law of the first two tokens under p/q verification equals the model's AR law."""
    V, T = 16, 1.0
    model = causal_model(seed=7, vocab=V)
    with torch.no_grad():  # the random network is near-uniform; sharpen it so the test has power
        model.lm_head.weight.mul_(40.0)
    p = [5, 9, 11]
    with torch.no_grad():
        p1 = (model(torch.tensor([p]))[0, -1] / T).softmax(-1)  # (V,)
        seqs = torch.tensor([p + [t] for t in range(V)])
        p2 = (model(seqs)[:, -1] / T).softmax(-1)  # (V, V)
    joint = (p1[:, None] * p2).flatten()  # (V*V,)
    dec = VerifyDecoder(model, [])
    n = 3000
    rows = [
        dec.new_row(
            p,
            SamplerConfig(
                max_new_tokens=2, policy="verify", draft=2, temperature=T, seed=s, stop_at_eos=False
            ),
        )
        for s in range(n)
    ]
    gen = dec.drive(rows)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            res = stop.value
            break
    counts = Counter(r.tokens[0] * V + r.tokens[1] for r in res)
    kept = sum(sum(r.accepted) for r in rows)
    assert 0 < kept < n  # both the accept and the reject branch ran
    exp = joint * n
    big = exp >= 5
    obs = torch.tensor([counts.get(i, 0) for i in range(V * V)], dtype=torch.float64)
    o = torch.cat((obs[big], obs[~big].sum()[None]))
    e = torch.cat((exp[big].double(), exp[~big].sum()[None].double()))
    stat = float(((o - e) ** 2 / e.clamp_min(1e-9)).sum())
    assert stat < chi2_critical(int(big.sum())), stat


def test_copy_drafts_are_lossless_and_keep_long_runs() -> None:
    """A model that continues its prompt by repeating it (an oracle: the prompt's own next token)
    keeps whole copied runs, many tokens a pass; greedy output is the same with copy drafts off,
    on garbage copies (a random model), alone and batched."""
    from quicksilver.sampling.decoders.copy_drafts import NgramIndex

    idx = NgramIndex([5, 6, 7, 8, 9, 5, 6, 7])
    assert idx.lookup(3) == ([8, 9, 5], 3)  # the suffix 5 6 7 recurs: what followed it
    assert NgramIndex([1, 2, 3, 4]).lookup(4) == ([], 0)
    model = causal_model(seed=7)
    ps = [p * 3 for p in prompts(4)]  # repeated text: copies match everywhere
    on = SamplerConfig(max_new_tokens=48, policy="verify", draft=4)
    off = on.replace(copy_drafts=False)
    dec = VerifyDecoder(model, [])
    want = [r.tokens for r in dec.generate(ps, off)]
    assert [r.tokens for r in dec.generate(ps, on)] == want
    assert [dec.generate([p], on)[0].tokens for p in ps] == want
    for p in ps:  # greedy AR of this model rarely repeats the prompt: copies are tried and rejected
        assert ar_generate(model, p, 48, []).tokens == dec.generate([p], on)[0].tokens


def test_a_copy_extends_the_drafts_it_repeats() -> None:
    """A copy is fed past the pass-rate estimate only when it repeats every draft held (or none
    are held), on a long match, for a row that keeps its copies."""
    from quicksilver.sampling.decoders.copy_drafts import EXTEND_MIN_MATCH, agreement, extends

    assert agreement([1, 2, 3], [1, 2]) == 2 and agreement([1, 2], [1, 5]) == 1
    assert agreement([], [1]) == 0
    long = EXTEND_MIN_MATCH
    assert extends([1, 2, 3, 4], [1, 2], long, 0.6) and extends([1, 2, 3], [], long, 0.6)
    assert not extends([1, 2, 3, 4], [1, 5], long, 0.9)  # the drafts say otherwise
    assert not extends([1, 2], [1, 2, 3], long, 0.9)  # shorter than the drafts
    assert not extends([1, 2, 3], [1, 2], long - 1, 0.9)  # a short match
    assert not extends([1, 2, 3], [1, 2], long, 0.4)  # this row's copies are mostly rejected


def test_copied_runs_are_kept_by_a_model_that_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits that always predict the token that followed the current one earlier in the row (a
    copying model): copy drafts are all kept, tokens per pass far above the mask drafts'."""
    model, k = Runtime(causal_model(seed=8)), 4
    base = list(range(10, 40))
    prompt = base + base[:5]  # the reply should copy base[5:]
    forward = model.forward_segments

    def copying(segs: list[Segment]) -> list[torch.Tensor]:
        out = forward(segs)
        for s, o in zip(segs, out):
            ids = s.ids.tolist()[s.lo : s.hi]
            for j, t in enumerate(ids):  # predict t's successor in base (mask: anything)
                o[j] = -10.0
                if t in base and base.index(t) + 1 < len(base):
                    o[j, base[base.index(t) + 1]] = 10.0
        return out

    monkeypatch.setattr(model, "forward_segments", copying)
    dec = VerifyDecoder(model, [])
    cfg = SamplerConfig(max_new_tokens=24, policy="verify", draft=k, stop_at_eos=False)
    res = dec.generate([prompt], cfg)[0]
    off = dec.generate([prompt], cfg.replace(copy_drafts=False))[0]
    assert res.tokens == off.tokens == base[5:29]
    assert res.copied > 0 and res.nfe < off.nfe
