"""DiffusionGemma's generation loop (sampling/decoders/noise_canvas.py) token for token against
``transformers``' ``DiffusionGemmaForBlockDiffusion.generate``.

A tiny random checkpoint (tests/test_parity_diffusion_gemma.py writes it with transformers' own
classes), the same prompt and the same random draws on both sides: transformers draws from torch's
global generator, ours from an explicit ``torch.Generator`` seeded alike, and the loop consumes its
draws in transformers' order (the starting canvas, then per step the categorical sample and the
renoise draw). Three canvases in a row on a batch of three, for: the default settings, early stops
on confidence alone (rows stop at different steps and are frozen), stops on stability (the argmax
canvas history), an EOS that ends one row a canvas before the others (pads after it), an injected
first canvas.

The loop is tested over transformers' own passes (``Replay``: every encoder/decoder call of its
generate is recorded, then served back to our loop, which must feed each call bit-identical
inputs), and quicksilver's network is tested along that same trajectory (logits within 1e-4 on
every pass). Tokens from our network under our loop are not compared end to end: the networks
agree to ~1e-5, not bit for bit, and on random tiny weights the soft-capped logits saturate near
the cap, so argmax/sampling near-ties flip within a few steps and the trajectories part.

Needs transformers >= 5.11 (the dev extra pins >= 5.23); skips otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
gen = pytest.importorskip("transformers.models.diffusion_gemma.generation_diffusion_gemma")

from quicksilver.models.families.diffusion_gemma import load_network  # noqa: E402
from quicksilver.models.families.diffusion_gemma_net import GemmaKVCache  # noqa: E402
from quicksilver.sampling.decoders.noise_canvas import (  # noqa: E402
    GeneratorNoise,
    NoiseCanvasConfig,
    entropy,
    entropy_bound_accept,
    generate,
)
from test_parity_diffusion_gemma import BASE, TOL, write_reference  # noqa: E402

V = BASE["vocab_size"]
C = 8  # write_reference's canvas_length
B, P, SEED = 3, 5, 7
CASES: dict[str, dict[str, Any]] = {
    "defaults": dict(),
    "confident": dict(entropy_bound=0.1, confidence_threshold=3.2, stability_threshold=0),
    "stable": dict(
        entropy_bound=100.0, confidence_threshold=10.0, stability_threshold=1, t_min=0.05, t_max=0.1
    ),
}


def hf_kwargs(cfg: NoiseCanvasConfig) -> dict[str, Any]:
    """The same settings as generate() keyword arguments for transformers."""
    kw: dict[str, Any] = dict(
        max_new_tokens=cfg.max_new_tokens,
        max_denoising_steps=cfg.max_denoising_steps,
        sampler_config=gen.EntropyBoundSamplerConfig(entropy_bound=cfg.entropy_bound),
        t_min=cfg.t_min,
        t_max=cfg.t_max,
        stability_threshold=cfg.stability_threshold,
        confidence_threshold=cfg.confidence_threshold,
    )
    if cfg.eos_token_ids:
        kw["eos_token_id"] = list(cfg.eos_token_ids)
    if cfg.pad_token_id is not None:
        kw["pad_token_id"] = cfg.pad_token_id
    return kw


class Replay:
    """transformers' network exactly as its ``generate`` called it: every encoder and decoder call
    (inputs and logits) is recorded during ``ref.generate`` and served back, in order, to our loop,
    which must feed each call the very same inputs (canvas, self-conditioning logits)."""

    def __init__(self, ref: torch.nn.Module) -> None:
        self.config = SimpleNamespace(canvas_length=C, vocab_size=V)
        self.calls: list[tuple[str, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        forward = ref.forward

        def decoder(**kw: Any) -> Any:
            out = forward(**kw)
            sc = kw.get("self_conditioning_logits")
            self.calls.append(
                ("decode", kw["decoder_input_ids"].clone(), _copy(sc), out.logits.clone())
            )
            return out

        def encoder(_: Any, args: Any, kw: dict[str, Any]) -> None:
            self.calls.append(("encode", kw["input_ids"].clone(), None, None))

        ref.forward = decoder  # generate() reads self.forward for its decoder passes
        ref.model.encoder.register_forward_pre_hook(encoder, with_kwargs=True)

    def encode(self, ids: torch.Tensor, cache: Any) -> None:
        kind, want, _, _ = self.calls.pop(0)
        assert kind == "encode" and torch.equal(ids, want)

    def decode(self, canvas: torch.Tensor, cache: Any, sc: Any = None, mask: Any = None) -> Any:
        kind, want, want_sc, logits = self.calls.pop(0)
        assert kind == "decode" and torch.equal(canvas, want) and mask is None
        assert (sc is None and want_sc is None) or torch.equal(sc, want_sc)
        return logits


def _copy(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def both(
    ref: torch.nn.Module, prompt: torch.Tensor, cfg: NoiseCanvasConfig, **extra: Any
) -> tuple[Any, Any]:
    """transformers' generate and ours (over transformers' recorded passes) from the same seed."""
    net = Replay(ref)
    torch.manual_seed(SEED)
    out = ref.generate(prompt, **hf_kwargs(cfg), **extra)
    g = torch.Generator().manual_seed(SEED)
    init = extra.get("decoder_input_ids")
    if init is not None:
        # transformers draws (and drops) a starting canvas even when it is handed one
        torch.randint(0, V, (B, C), generator=g)
    res = generate(net, prompt, cfg, g, initial_canvas=init)
    assert net.calls == []  # as many passes as transformers made
    return out, res


def check(out: Any, res: Any, pad: int | None = None) -> None:
    assert out.sequences.shape == (B, P + 3 * C)
    assert torch.equal(res.tokens, out.sequences)
    valid = (res.new_tokens != pad).sum(-1) if pad is not None else res.new_tokens.shape[1]
    torch.testing.assert_close(out.tokens_per_forward, valid / res.decoder_passes)


def prompt_ids() -> torch.Tensor:
    return torch.randint(0, V, (B, P), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", ["moe", "dense"])
def test_generate_matches_transformers(tmp_path: Path, shape: str, case: str) -> None:
    ref = write_reference(shape, tmp_path)
    cfg = NoiseCanvasConfig.from_checkpoint(
        tmp_path, max_new_tokens=3 * C, max_denoising_steps=10, **CASES[case]
    )
    out, res = both(ref, prompt_ids(), cfg)
    check(out, res)
    if case == "confident" or (case, shape) == ("stable", "dense"):
        # some row stopped early (the random MoE net's argmax canvas never settles)
        assert int(res.decoder_passes.min()) < 3 * cfg.max_denoising_steps


@pytest.mark.parametrize("shape", ["moe", "dense"])
def test_our_network_along_the_trajectory(tmp_path: Path, shape: str) -> None:
    """The other half of the stack: on every pass transformers' generate made (three canvases),
    quicksilver's network given the same inputs gives the same logits within 1e-4."""
    ref = write_reference(shape, tmp_path)
    replay = Replay(ref)
    cfg = NoiseCanvasConfig(max_new_tokens=3 * C, max_denoising_steps=10)
    torch.manual_seed(SEED)
    ref.generate(prompt_ids(), **hf_kwargs(cfg))
    net, cache = load_network(tmp_path), GemmaKVCache()
    kinds = [call[0] for call in replay.calls]
    assert kinds.count("encode") == 3 and kinds.count("decode") == 30
    with torch.no_grad():
        for kind, ids, sc, logits in replay.calls:
            if kind == "encode":
                net.encode(ids, cache)
            else:
                assert logits is not None
                err = (net.decode(ids, cache, sc) - logits).abs().max().item()
                assert err < TOL, f"decoder pass: max |diff| {err:.3g}"


@pytest.mark.parametrize("shape", ["moe", "dense"])
def test_eos_ends_one_row_early(tmp_path: Path, shape: str) -> None:
    ref = write_reference(shape, tmp_path)
    cfg = NoiseCanvasConfig(max_new_tokens=3 * C, max_denoising_steps=10)
    prompt = prompt_ids()
    torch.manual_seed(SEED)
    new = ref.generate(prompt, **hf_kwargs(cfg)).sequences[:, P:]  # (B, 3C) without an EOS
    # an EOS id inside row 0's second canvas (not its last position) found nowhere before it and
    # nowhere in the other rows' first two canvases: row 0 ends a canvas before the others
    others = set(new[1:, : 2 * C].flatten().tolist()) | set(new[0, :C].tolist())
    eos = next(t for t in new[0, C : 2 * C - 1].tolist() if t not in others)
    unused = [t for t in range(V) if t not in set(new.flatten().tolist())]
    pad, eos2 = unused[0], unused[1]  # a second EOS id that never comes up
    cfg = NoiseCanvasConfig(
        max_new_tokens=3 * C, max_denoising_steps=10, eos_token_ids=(eos, eos2), pad_token_id=pad
    )
    out, res = both(ref, prompt, cfg)
    check(out, res, pad)
    assert res.finished.tolist() == [True, True, True]  # row 0 on EOS, the rest on length
    row0 = res.new_tokens[0].tolist()
    cut = row0.index(eos)
    assert C <= cut < 2 * C - 1 and set(row0[cut + 1 :]) == {pad}
    assert pad not in res.new_tokens[1:].flatten().tolist()


def test_injected_first_canvas(tmp_path: Path) -> None:
    ref = write_reference("moe", tmp_path)
    cfg = NoiseCanvasConfig(max_new_tokens=3 * C, max_denoising_steps=6)
    init = torch.randint(0, V, (B, C), generator=torch.Generator().manual_seed(11))
    out, res = both(ref, prompt_ids(), cfg, decoder_input_ids=init)
    check(out, res)


def test_config_from_generation_config(tmp_path: Path) -> None:
    assert NoiseCanvasConfig.from_checkpoint(tmp_path) == NoiseCanvasConfig()  # no file: defaults
    gen.DiffusionGemmaGenerationConfig(
        max_new_tokens=512,
        max_denoising_steps=16,
        sampler_config=gen.EntropyBoundSamplerConfig(entropy_bound=0.25),
        t_min=0.3,
        t_max=0.9,
        stability_threshold=2,
        confidence_threshold=0.01,
        eos_token_id=[1, 106],
        pad_token_id=0,
    ).save_pretrained(tmp_path)
    assert "sampler_config" in json.loads((tmp_path / "generation_config.json").read_text())
    cfg = NoiseCanvasConfig.from_checkpoint(tmp_path, max_new_tokens=64)
    assert cfg == NoiseCanvasConfig(
        max_new_tokens=64,
        max_denoising_steps=16,
        entropy_bound=0.25,
        t_min=0.3,
        t_max=0.9,
        stability_threshold=2,
        confidence_threshold=0.01,
        eos_token_ids=(1, 106),
        pad_token_id=0,
    )


def test_entropy_and_acceptance_match_transformers() -> None:
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(2, 8, V, generator=g)  # (B, C, V)
    ref_ent = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.equal(entropy(logits), ref_ent)
    sampler = gen.EntropyBoundSampler(gen.EntropyBoundSamplerConfig(entropy_bound=1.5), 8, V, 4)
    canvas, drawn = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long)
    accepted = sampler.accept_canvas(canvas, drawn, logits, 1)
    assert torch.equal(entropy_bound_accept(ref_ent, 1.5), accepted == 1)
    schedule = gen.LinearTemperatureScheduleLogitsProcessor(0.4, 0.8, 48)
    cfg = NoiseCanvasConfig()
    for step in (48, 17, 1):
        scaled = schedule(None, logits, cur_step=torch.tensor(step, dtype=torch.int32))
        temp = cfg.temperature(step)
        assert temp is not None and torch.equal(logits / temp, scaled)


class Recorded:
    """A ``CanvasNoise`` that draws from a generator and logs each draw (kind, tensor)."""

    def __init__(self, g: torch.Generator) -> None:
        self.inner = GeneratorNoise(g)
        self.log: list[tuple[str, torch.Tensor]] = []

    def uniform(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        self.log.append(("uniform", self.inner.uniform(shape, vocab_size)))
        return self.log[-1][1]

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        self.log.append(("categorical", self.inner.categorical(probs)))
        return self.log[-1][1]


class Scripted:
    """A ``CanvasNoise`` serving pre-drawn tensors in order."""

    def __init__(self, log: list[tuple[str, torch.Tensor]]) -> None:
        self.log = list(log)

    def uniform(self, shape: tuple[int, int], vocab_size: int) -> torch.Tensor:
        kind, t = self.log.pop(0)
        assert kind == "uniform" and t.shape == shape
        return t

    def categorical(self, probs: torch.Tensor) -> torch.Tensor:
        kind, t = self.log.pop(0)
        assert kind == "categorical" and t.shape == probs.shape[:1]
        return t


def test_injected_noise_replaces_the_generator(tmp_path: Path) -> None:
    write_reference("dense", tmp_path)
    net = load_network(tmp_path)
    cfg = NoiseCanvasConfig(max_new_tokens=2 * C, max_denoising_steps=3)
    rec = Recorded(torch.Generator().manual_seed(SEED))
    first = generate(net, prompt_ids(), cfg, noise=rec)
    # per canvas: the starting canvas, then per step a sample and a renoise draw
    assert [k for k, _ in rec.log] == (["uniform"] + ["categorical", "uniform"] * 3) * 2
    again = generate(net, prompt_ids(), cfg, noise=Scripted(rec.log))
    assert torch.equal(first.tokens, again.tokens)
    seeded = generate(net, prompt_ids(), cfg, torch.Generator().manual_seed(SEED))
    assert torch.equal(first.tokens, seeded.tokens)
