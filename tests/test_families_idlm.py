"""The I-DLM family (models/families/idlm.py): a tiny random Qwen3ForCausalLM directory with a mask
token, in the real on-disk format, loads as a causal model whose logits equal transformers'
``Qwen3ForCausalLM`` (loaded by transformers itself from the same directory, fp32, max |diff| <=
1e-4), and whose verify decoding with k drafts per pass gives the draft-0 (plain AR) output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import quicksilver
from family_fixtures import write_tiny_idlm
from quicksilver import CheckpointError
from quicksilver.models.checkpoint import load_checkpoint
from quicksilver.models.families import family_of, generation_defaults
from quicksilver.sampling import SamplerConfig
from quicksilver.sampling.decoders.verify import VerifyDecoder
from test_verify import uncached_greedy

TOL = 1e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_idlm(tmp_path_factory.mktemp("idlm"))


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 261, (5 + 4 * i,), generator=g).tolist() for i in range(n)]


def test_loads_as_a_causal_verify_model(tiny: Path) -> None:
    model, tok = load_checkpoint(tiny, dtype=torch.float32, device="cpu")
    cfg = model.config
    assert (cfg.attention, cfg.logit_shift, cfg.qk_norm, cfg.draft_length) == (
        "causal",
        False,
        True,
        3,
    )
    assert cfg.dim_head == 32 != cfg.d_model // cfg.n_heads  # head_dim read from config.json
    assert cfg.mask_token_id == tok.mask_id == tok.token_to_id("<|MASK|>")
    assert tok.token_to_id("<|im_end|>") in tok.stop_ids
    assert family_of("Qwen3ForCausalLM") is not None
    assert generation_defaults("Qwen3ForCausalLM")["policy"] == "verify"
    pipe = quicksilver.load(tiny, device="cpu")
    assert isinstance(pipe.decoder, VerifyDecoder)


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers_qwen3(tie: bool, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    d = write_tiny_idlm(tmp_path, tie=tie)
    assert (d / "model.safetensors.index.json").is_file()  # sharded, like Qwen3-8B
    ref = transformers.Qwen3ForCausalLM.from_pretrained(
        d, local_files_only=True, attn_implementation="eager"
    ).eval()
    model, _ = load_checkpoint(d, dtype=torch.float32, device="cpu")
    if tie:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 261, (2, 12), generator=torch.Generator().manual_seed(2))  # (B, T)
    with torch.no_grad():
        want = ref(ids).logits  # (B, T, V): transformers' own causal mask, i predicts i + 1
        full = ref(ids, attention_mask=torch.zeros(2, 1, 12, 12)).logits  # a 4-D mask: no causality
        got = model(ids)  # (B, T, V)
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"I-DLM vs Qwen3ForCausalLM (tie={tie}): max |diff| {diff:.2e}"
    assert (got - full).abs().max().item() > 1e-2  # the causal mask is really in effect


def test_verify_with_k_drafts_equals_draft_zero(tiny: Path) -> None:
    model, tok = load_checkpoint(tiny, dtype=torch.float32, device="cpu")
    stops = [tok.token_to_id("<|im_end|>")]
    dec = VerifyDecoder(model, stops)
    ps = prompts(3)

    def run(draft: int | None, rows: list[list[int]]) -> list[list[int]]:
        cfg = SamplerConfig(max_new_tokens=24, policy="verify", draft=draft, stop_at_eos=False)
        return [r.tokens for r in dec.generate(rows, cfg)]

    with torch.no_grad():
        ar = [uncached_greedy(model, p, 24, []) for p in ps]  # the obviously correct loop
        zero = [run(0, [p])[0] for p in ps]
        alone = [run(None, [p])[0] for p in ps]  # None: the model's draft_length (3)
        batched = run(None, ps)
    assert zero == ar
    assert alone == zero and batched == zero


def test_pipeline_defaults_sample_and_greedy_is_lossless(tiny: Path) -> None:
    pipe = quicksilver.load(tiny, device="cpu")
    cfg = pipe.sampler_config()
    assert (cfg.policy, cfg.temperature, cfg.top_p, cfg.draft) == ("verify", 1.0, 0.95, None)
    opts = dict(max_new_tokens=16, stop_at_eos=False)
    a = pipe.generate("the cat", chat=True, seed=7, **opts)
    assert a.tokens == pipe.generate("the cat", chat=True, seed=7, **opts).tokens  # seeded
    g0 = pipe.generate("the cat", chat=True, temperature=0.0, draft=0, **opts)
    gk = pipe.generate("the cat", chat=True, temperature=0.0, **opts)
    assert gk.tokens == g0.tokens and g0.nfe == 16 and gk.nfe <= 16


def test_block_size_sets_the_draft_length_and_plain_qwen3_is_refused(tmp_path: Path) -> None:
    d = write_tiny_idlm(tmp_path / "b5", block_size=5)
    assert load_checkpoint(d, device="cpu")[0].config.draft_length == 5
    d = write_tiny_idlm(tmp_path / "cfg")  # the mask id from config.json wins
    cj = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cj, "mask_token_id": 265}))
    assert load_checkpoint(d, device="cpu")[0].config.mask_token_id == 265
    d = write_tiny_idlm(tmp_path / "plain", mask=False)
    with pytest.raises(CheckpointError, match="without a mask token") as e:
        load_checkpoint(d, device="cpu")
    assert "\n" not in str(e.value)


def test_gpu_run_idlm_stage(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import argparse

    from quicksilver.bench import gpu_run

    base = dict(tiny=True, budget=540.0, out=str(tmp_path))
    names = [n for n, _ in gpu_run.stages(argparse.Namespace(**base, idlm=None), tmp_path)]
    assert "idlm" not in names  # no directory given: no stage
    with_dir = gpu_run.stages(argparse.Namespace(**base, idlm=str(tiny)), tmp_path)
    assert [n for n, _ in with_dir][-2:] == ["idlm", "speed"]
    rc = gpu_run.main(["--idlm-stage", str(tiny), "--tiny", "--out", str(tmp_path / "s")])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["bench"] == "idlm" and out["greedy_equal"] is True
    assert [r["draft"] for r in out["rows"]] == [0, 3]
    assert json.loads((tmp_path / "s" / "idlm.json").read_text()) == out
