"""Decoder invariants: length, immutability of commits, seeds, batching, thresholds, EOS, revision,
agreement with the reference decoder, and the statistics of temperature-1 sampling."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.sampling import POLICIES, Decoder, SamplerConfig, reference_generate, sample_tokens
from quicksilver.sampling.core.noise import filter_top_p

MASK, EOS = 2, 1
PROMPTS = [list(range(20, 37)), list(range(50, 59)), list(range(70, 75))]


def _model(attention: str = "bidirectional", seed: int = 0, **kw) -> Transformer:  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    return Transformer(
        preset("tiny", vocab_size=96, attention=attention, block_size=8, **kw)
    ).eval()


def _decoder(model: Transformer, **kw) -> Decoder:  # type: ignore[no-untyped-def]
    return Decoder(model, MASK, [EOS], vocab_limit=96, **kw)


def _no_eos(model: Transformer) -> Transformer:
    with torch.no_grad():
        model.lm_head.weight[EOS] = (
            -model.lm_head.weight[EOS].abs() * 0 - 0.0
        )  # zero row: EOS rarely wins
    return model


def _events(dec: Decoder, prompt: list[int], cfg: SamplerConfig):  # type: ignore[no-untyped-def]
    gen = dec.run([prompt], cfg)
    evs = []
    while True:
        try:
            evs.extend(next(gen))
        except StopIteration as stop:
            return evs, stop.value[0]


@pytest.mark.parametrize("policy", sorted(p for p in POLICIES if POLICIES[p].rule != "verify"))
@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
def test_every_policy_respects_length_and_never_changes_commits(
    policy: str, attention: str
) -> None:
    dec = _decoder(_model(attention))
    cfg = SamplerConfig(max_new_tokens=20, policy=policy, threshold=0.05, seed=3, stop_at_eos=False)
    evs, res = _events(dec, PROMPTS[0], cfg)
    assert len(res.tokens) == 20 and res.finish_reason == "length"
    seen: dict[int, int] = {}
    for ev in evs:
        assert not ev.remasked
        for p, t in ev.committed:
            assert p not in seen, "a committed position was committed again"
            seen[p] = t
    assert [seen[i] for i in range(20)] == res.tokens and res.nfe == len(evs)
    assert evs[-1].done and evs[-1].stable == 20


def test_schedule_policies_use_the_requested_steps() -> None:
    dec = _decoder(_model())
    res = dec.generate(
        [PROMPTS[0]],
        SamplerConfig(
            max_new_tokens=32, policy="low_confidence", steps=8, block_length=16, stop_at_eos=False
        ),
    )[0]
    assert res.nfe == 8 and res.tpf == 4.0


def test_threshold_one_commits_one_token_per_step_and_low_threshold_many() -> None:
    dec = _decoder(_model())
    strict = dec.generate(
        [PROMPTS[1]],
        SamplerConfig(max_new_tokens=16, policy="threshold", threshold=1.0, stop_at_eos=False),
    )[0]
    assert strict.nfe == 16
    loose = dec.generate(
        [PROMPTS[1]],
        SamplerConfig(
            max_new_tokens=16,
            policy="threshold",
            threshold=1e-6,
            block_length=16,
            stop_at_eos=False,
        ),
    )[0]
    assert loose.nfe == 1 and len(loose.tokens) == 16


def test_temperature_zero_is_deterministic_and_seeds_reproduce() -> None:
    dec = _decoder(_model())
    greedy = SamplerConfig(max_new_tokens=24, policy="threshold", threshold=0.5, stop_at_eos=False)
    assert (
        dec.generate([PROMPTS[0]], greedy)[0].tokens == dec.generate([PROMPTS[0]], greedy)[0].tokens
    )
    hot = greedy.replace(temperature=1.0, seed=7)
    a, b = dec.generate([PROMPTS[0]], hot)[0].tokens, dec.generate([PROMPTS[0]], hot)[0].tokens
    c = dec.generate([PROMPTS[0]], hot.replace(seed=8))[0].tokens
    assert a == b and a != c


@pytest.mark.parametrize("attention", ["bidirectional", "block_causal"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_row_equals_the_same_prompt_alone(attention: str, temperature: float) -> None:
    dec = _decoder(_model(attention))
    cfgs = [
        SamplerConfig(max_new_tokens=n, policy=p, threshold=0.2, temperature=temperature, seed=i)
        for i, (n, p) in enumerate([(24, "threshold"), (9, "low_confidence"), (17, "margin")])
    ]
    batched = dec.generate(PROMPTS, cfgs)
    alone = [dec.generate([p], c)[0] for p, c in zip(PROMPTS, cfgs)]
    assert [r.tokens for r in batched] == [r.tokens for r in alone]
    assert [r.nfe for r in batched] == [r.nfe for r in alone]


@pytest.mark.parametrize("shift", [False, True])
def test_block_cache_equals_no_cache(shift: bool) -> None:
    m = _model("block_causal", logit_shift=shift)
    cfg = SamplerConfig(max_new_tokens=30, policy="threshold", threshold=0.3, stop_at_eos=False)
    cached = _decoder(m).generate(PROMPTS, cfg)
    plain = _decoder(m, use_cache=False).generate(PROMPTS, cfg)
    assert [r.tokens for r in cached] == [r.tokens for r in plain]


def test_early_stop_at_eos_drops_the_tail_and_never_computes_it() -> None:
    m = _model()
    with torch.no_grad():  # make EOS likely at every position
        m.lm_head.weight[EOS] = m.lm_head.weight[EOS] * 0 + m.model.norm.weight.sign() * 0.5
    dec = _decoder(m)
    seen_lengths: list[int] = []
    orig = dec.runtime.forward_segments

    def spy(segs):  # type: ignore[no-untyped-def]
        seen_lengths.append(int(segs[0].ids.shape[0]))
        return orig(segs)

    dec.runtime.forward_segments = spy  # type: ignore[method-assign]
    evs, res = _events(
        dec, PROMPTS[0], SamplerConfig(max_new_tokens=40, policy="low_confidence", steps=40)
    )
    assert res.finish_reason == "stop" and EOS not in res.tokens and len(res.tokens) < 40
    assert any(ev.end < 40 for ev in evs[:-1])  # stopped before the last step
    for ev, n in zip(
        evs, seen_lengths[1:]
    ):  # after each step only prompt + canvas up to the stop token
        assert n <= len(PROMPTS[0]) + ev.end + 1
    assert evs[-1].end == len(res.tokens)


def test_no_stop_at_eos_keeps_the_whole_canvas() -> None:
    m = _model()
    with torch.no_grad():
        m.lm_head.weight[EOS] = m.lm_head.weight[EOS] * 0 + m.model.norm.weight.sign() * 0.5
    res = _decoder(m).generate(
        [PROMPTS[0]], SamplerConfig(max_new_tokens=12, policy="low_confidence", stop_at_eos=False)
    )[0]
    assert len(res.tokens) == 12


def test_revision_remasks_and_terminates() -> None:
    dec = _decoder(_model())
    cfg = SamplerConfig(
        max_new_tokens=24,
        policy="threshold",
        threshold=0.01,
        revise_threshold=0.99,
        max_revisions=2,
        stop_at_eos=False,
        block_length=8,
    )
    evs, res = _events(dec, PROMPTS[0], cfg)
    assert res.revisions > 0 and any(ev.remasked for ev in evs)
    assert len(res.tokens) == 24 and res.steps <= 24 * (1 + 2)
    for ev in evs:  # the stable prefix never includes the block under revision
        assert ev.stable <= 24


def test_prefill_and_constraint_hooks() -> None:
    dec = _decoder(_model())

    class OnlyEven:
        def mask_logits(self, row, lo, logits):  # type: ignore[no-untyped-def]
            logits = logits.clone()
            logits[:, 1::2] = float("-inf")
            return logits

        def allow(self, row, pos, token):  # type: ignore[no-untyped-def]
            return token % 4 == 0 or pos % 2 == 0

    row = dec.new_row(
        PROMPTS[0],
        SamplerConfig(max_new_tokens=12, policy="threshold", threshold=0.01, stop_at_eos=False),
        prefill={0: 60, 11: 61},
        constraint=OnlyEven(),
    )
    while not row.done:
        dec.step([row])
    out = row.result().tokens
    assert out[0] == 60 and out[11] == 61
    assert all(t % 2 == 0 for t in out[1:11]) and all(
        t % 4 == 0 for i, t in enumerate(out[1:11], 1) if i % 2
    )


def test_suffix_needs_a_bidirectional_model_and_is_seen() -> None:
    m = _model()
    bi = _decoder(m)
    cfg = SamplerConfig(max_new_tokens=8, stop_at_eos=False, policy="low_confidence")
    plain = bi.new_row(PROMPTS[1], cfg)
    row = bi.new_row(PROMPTS[1], cfg, suffix=[80, 81, 82, 83])
    seg = row.segment()
    assert (
        seg.ids[-4:].tolist() == [80, 81, 82, 83] and seg.hi - seg.lo == 8
    )  # canvas between prompt and suffix
    with torch.no_grad():
        a, b = bi.runtime.forward_segments([plain.segment(), seg])
    assert not torch.allclose(a, b, atol=1e-4)  # the infill sees the suffix
    while not row.done:
        bi.step([row])
    assert len(row.result().tokens) == 8
    with pytest.raises(ConfigError, match="bidirectional"):
        _decoder(_model("block_causal")).new_row(
            PROMPTS[1], SamplerConfig(max_new_tokens=8), suffix=[5]
        )


@pytest.mark.parametrize("block", [8, 24])
def test_fast_decoder_agrees_with_the_reference(block: int) -> None:
    """Same semantics (low_confidence, fixed steps, blocks, no early stop, no cache): same tokens."""
    m = _model()
    dec = _decoder(m, use_cache=False)
    for prompt in PROMPTS[:2]:
        ref = reference_generate(m, prompt, MASK, gen_length=24, steps=12, block_length=block)
        fast = dec.generate(
            [prompt],
            SamplerConfig(
                max_new_tokens=24,
                policy="low_confidence",
                steps=12,
                block_length=block,
                stop_at_eos=False,
            ),
        )[0]
        assert fast.tokens == ref.canvas and fast.nfe == ref.nfe == 12


def test_bad_sampler_options_raise_config_errors() -> None:
    dec = _decoder(_model())
    for bad in [
        dict(policy="nope"),
        dict(threshold=0.0),
        dict(threshold=1.5),
        dict(max_new_tokens=0),
        dict(max_new_tokens=10_000),
        dict(top_p=0.0),
        dict(temperature=-1.0),
        dict(steps=0),
        dict(revise_threshold=1.0),
    ]:
        with pytest.raises(ConfigError):
            dec.new_row(PROMPTS[0], SamplerConfig(**bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="context"):
        dec.new_row(list(range(5, 90)) * 7, SamplerConfig(max_new_tokens=4))
    with pytest.raises(ConfigError):
        SamplerConfig().replace(bogus=1)


def test_temperature_one_draws_follow_the_distribution() -> None:
    """Chi-square goodness of fit of 40k categorical draws against softmax(logits)."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5]])
    probs = logits.double().softmax(-1)[0]
    gen = torch.Generator().manual_seed(0)
    n = 40_000
    draws = sample_tokens(logits.expand(n, -1), 1.0, 1.0, gen)
    counts = Counter(draws.tolist())
    chi2 = sum((counts.get(i, 0) - n * float(p)) ** 2 / (n * float(p)) for i, p in enumerate(probs))
    assert chi2 < 24.3  # 7 degrees of freedom, p = 0.001
    # and a temperature of 0.5 sharpens: the top token's frequency follows softmax(logits / 0.5)
    hot = sample_tokens(logits.expand(n, -1), 0.5, 1.0, gen)
    p0 = float((logits.double() / 0.5).softmax(-1)[0, 0])
    assert abs((hot == 0).double().mean().item() - p0) < 4 * math.sqrt(p0 * (1 - p0) / n)


def test_top_p_keeps_the_nucleus_only() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64))
    kept = filter_top_p(logits, 0.75)
    assert torch.isfinite(kept).tolist() == [[True, True, False, False]]
    gen = torch.Generator().manual_seed(1)
    draws = sample_tokens(logits.expand(5000, -1), 1.0, 0.75, gen)
    assert set(draws.tolist()) <= {0, 1}


def test_top_k_samples_only_among_the_k_most_likely() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, generator=g)  # (n, V)
    top2 = logits.topk(2, dim=-1).indices  # (n, 2)
    drawn = [sample_tokens(logits, 2.0, 1.0, torch.Generator().manual_seed(s), 2) for s in range(8)]
    assert all(bool((d[:, None] == top2).any(-1).all()) for d in drawn)
    assert any(bool((d != logits.argmax(-1)).any()) for d in drawn)  # it does sample
    one = sample_tokens(logits, 5.0, 1.0, torch.Generator().manual_seed(1), 1)
    assert torch.equal(one, logits.argmax(-1))  # k = 1 is greedy at any temperature
    with pytest.raises(ConfigError, match="top_k"):
        SamplerConfig(top_k=-1).validate()
    model = Transformer(preset("tiny", attention="block_causal", block_size=8)).eval()
    dec = Decoder(model, model.config.mask_token_id, [])
    greedy = dec.generate([[5, 6, 7]], SamplerConfig(max_new_tokens=16, stop_at_eos=False))[0]
    hot = SamplerConfig(max_new_tokens=16, stop_at_eos=False, temperature=3.0, top_k=1, seed=4)
    assert dec.generate([[5, 6, 7]], hot)[0].tokens == greedy.tokens
