"""The family loaders end to end: tokenizers, chat templates, token roles, decoding defaults, the exact
block KV cache of the block-causal families, decoding through the CLI, and clear errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import quicksilver
from family_fixtures import FAMILY_NAMES, SPECIALS, write_tiny
from quicksilver import CheckpointError
from quicksilver.cli import main as cli_main
from quicksilver.models import KVCache
from quicksilver.models.families import FAMILIES, generation_defaults
from quicksilver.models.families.common import bpe_tokenizer_from_vocab

TEXTS = [
    "Hello, world! The cat's 123 numbers\n\n  spaced   out",
    "naïve café — ünïcödé e\u0301",  # a combining accent: NFC folds it
    "<|im_start|>user\nwhat is 7*6?<|im_end|>\n",
    "tabs\tand\r\nnewlines  \n",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {f: write_tiny(f, tmp_path_factory.mktemp(f)) for f in FAMILY_NAMES}


# ---- tokenizers and templates -------------------------------------------------------------------
def test_dream_tokenizer_from_vocab_and_merges_matches_transformers_qwen2(
    tiny: dict[str, Path],
) -> None:
    transformers = pytest.importorskip("transformers")
    d = tiny["dream"]
    assert not (d / "tokenizer.json").exists()  # Dream ships only vocab.json + merges.txt
    ours = bpe_tokenizer_from_vocab(d)
    files = {"vocab_file": str(d / "vocab.json"), "merges_file": str(d / "merges.txt")}
    if int(transformers.__version__.split(".")[0]) >= 5:  # 5.x takes them as vocab= / merges=
        files = {"vocab": files["vocab_file"], "merges": files["merges_file"]}
    ref = transformers.Qwen2Tokenizer(
        **files,
        errors="replace",
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    ref.add_special_tokens({"additional_special_tokens": SPECIALS["dream"][1:]})
    for t in SPECIALS["dream"]:
        assert ours.token_to_id(t) == ref.convert_tokens_to_ids(t)
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == ref.decode(
            ref.encode(text)
        )


def test_roles_and_stop_tokens(tiny: dict[str, Path]) -> None:
    llada = quicksilver.load(tiny["llada"], device="cpu")
    tok = llada.tokenizer
    assert (
        tok.mask_id == tok.token_to_id("<|mdm_mask|>") == llada.config.mask_token_id
    )  # not declared upstream
    assert (
        tok.token_to_id("<|eot_id|>") in llada.stop_ids
        and tok.token_to_id("<|endoftext|>") in llada.stop_ids
    )
    dream = quicksilver.load(tiny["dream"], device="cpu")
    assert (
        dream.tokenizer.mask_id
        == dream.tokenizer.token_to_id("<|mask|>")
        == dream.config.mask_token_id
    )
    assert dream.tokenizer.bos_id == dream.tokenizer.token_to_id("<|beginoftext|>")
    assert dream.tokenizer.token_to_id("<|im_end|>") in dream.stop_ids
    fd = quicksilver.load(
        tiny["fast_dllm_v2"], device="cpu"
    )  # mask only in the vocabulary, not config.json
    assert fd.config.mask_token_id == fd.tokenizer.token_to_id("|<MASK>|")
    l2 = quicksilver.load(tiny["llada2"], device="cpu")
    assert l2.config.mask_token_id == l2.tokenizer.token_to_id("<|mask|>")
    assert l2.tokenizer.token_to_id("<|role_end|>") in l2.stop_ids


def test_chat_templates_render_published_formats(tiny: dict[str, Path]) -> None:
    msgs = [{"role": "user", "content": "  What is 2+2?  "}]
    llada = quicksilver.load(tiny["llada"], device="cpu").tokenizer
    assert llada.apply_chat_template(msgs) == (
        "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    two = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (
        llada.apply_chat_template(two).count("<|startoftext|>") == 1
    )  # BOS before the first message only
    dream = quicksilver.load(tiny["dream"], device="cpu").tokenizer
    assert dream.apply_chat_template([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    fd = quicksilver.load(tiny["fast_dllm_v2"], device="cpu").tokenizer  # from chat_template.jinja
    assert fd.apply_chat_template(two).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"
    )
    l2 = quicksilver.load(tiny["llada2"], device="cpu").tokenizer
    assert l2.apply_chat_template(two) == (
        "<role>SYSTEM</role>Be brief.<|role_end|><role>HUMAN</role>Hi<|role_end|><role>ASSISTANT</role>"
    )
    ids = l2.encode(l2.apply_chat_template(two))
    assert l2.token_to_id("<|role_end|>") in ids  # special tokens in the template encode as one id


# ---- dispatch, defaults -------------------------------------------------------------------------
def test_dispatch_on_architectures_not_model_type(tiny: dict[str, Path]) -> None:
    cj = json.loads((tiny["llada_moe"] / "config.json").read_text())
    assert cj["model_type"] == "llada"  # the same model_type as dense LLaDA
    pipe = quicksilver.load(tiny["llada_moe"], device="cpu")
    assert pipe.config.moe is not None and pipe.config.moe.layers == [1]


def test_generation_defaults_per_family_and_override(tiny: dict[str, Path], tmp_path: Path) -> None:
    assert generation_defaults("LLaDAModelLM")["policy"] == "low_confidence"
    assert generation_defaults("DreamModel")["policy"] == "entropy"
    assert generation_defaults("Fast_dLLM_QwenForCausalLM")["block_length"] == 8
    assert generation_defaults("QuicksilverForDiffusionLM") == {}
    assert all(f.defaults for f in FAMILIES.values())
    pipe = quicksilver.load(tiny["llada"], device="cpu")
    assert pipe.sampler_config().policy == "low_confidence"
    assert pipe.sampler_config(policy="threshold").policy == "threshold"  # request options win
    d = write_tiny("sdar", tmp_path / "sdar")
    (d / "sampler_config.json").write_text(json.dumps({"threshold": 0.7}))
    assert quicksilver.load(d, device="cpu").sampler_config().threshold == 0.7
    (d / "sampler_config.json").write_text(json.dumps({"thresh": 0.7}))
    with pytest.raises(CheckpointError, match="unknown sampler options"):
        quicksilver.load(d, device="cpu")


# ---- exact block cache ----------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["fast_dllm_v2", "sdar", "llada2"])
def test_block_cache_equals_full_forward(family: str, tiny: dict[str, Path]) -> None:
    model = quicksilver.load(tiny[family], device="cpu").model
    bs = model.config.block_size
    assert model.config.attention == "block_causal" and bs == 4
    ids = torch.randint(
        0, 250, (2, 3 * bs), generator=torch.Generator().manual_seed(3)
    )  # (B, 3 blocks)
    with torch.no_grad():
        full = model(ids)  # (B, T, V)
        cache = KVCache()
        model(ids[:, :bs], cache=cache, append=True)  # prefill block 0
        for b in (1, 2):
            blk = ids[:, b * bs : (b + 1) * bs]
            step = model(blk, cache=cache)  # the in-progress block against the cached prefix
            diff = (step - full[:, b * bs : (b + 1) * bs]).abs().max().item()
            assert diff <= 1e-5, f"{family} block {b}: cached vs full max |diff| {diff:.2e}"
            model(blk, cache=cache, append=True)  # the block is final: append its exact K/V
        assert cache.length == 3 * bs


# ---- decoding through the CLI -------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_generate_cli_on_every_family(
    family: str, tiny: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    rc = cli_main(
        ["generate", "the cat", "--model", str(tiny[family]), "--max-tokens", "8", "--json"]
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and out["nfe"] >= 1 and len(out["tokens"]) <= 8
    assert out["prompt_tokens"] > 2  # the chat template was applied
    assert out["finish_reason"] in ("stop", "length")


def test_generate_cli_flags_override_family_defaults(
    tiny: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    base = [
        "generate",
        "x",
        "--model",
        str(tiny["llada"]),
        "--max-tokens",
        "8",
        "--json",
        "--no-stop-at-eos",
    ]
    cli_main(base)  # family default: low_confidence, one token per step
    assert json.loads(capsys.readouterr().out.strip())["nfe"] == 8
    cli_main(base + ["--steps", "2"])
    assert json.loads(capsys.readouterr().out.strip())["nfe"] == 2


def test_bf16_load(tiny: dict[str, Path]) -> None:
    fp32 = quicksilver.load(tiny["llada2"], device="cpu")
    bf16 = quicksilver.load(tiny["llada2"], dtype=torch.bfloat16, device="cpu")
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    ids = torch.arange(8)[None]
    with torch.no_grad():
        a, b = fp32.model(ids), bf16.model(ids).float()
    assert (a - b).abs().max().item() < 0.5 * a.abs().max().item()


# ---- bad input: one-line CheckpointErrors ---------------------------------------------------------
def _edit_config(d: Path, **changes: object) -> None:
    cj = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cj.pop(k, None)
        else:
            cj[k] = v
    (d / "config.json").write_text(json.dumps(cj))


@pytest.mark.parametrize(
    "family,changes,message",
    [
        ("dream", {"hidden_size": None}, "missing 'hidden_size'"),
        ("dream", {"num_attention_heads": "four"}, "must be an integer"),
        ("llada", {"block_type": "sequential"}, "unsupported LLaDA variant"),
        ("sdar", {"intermediate_size": 100}, "shape"),
        ("llada_moe", {"moe_layer_freq": [1]}, "moe_layer_freq"),
        ("llada2", {"score_function": "softmax"}, "score_function"),
        ("llada2", {"num_attention_heads": 6}, "query_key_value"),
        ("fast_dllm_v2", {"architectures": ["NoSuchModel"]}, "unsupported architecture"),
    ],
)
def test_malformed_configs_are_clear_errors(
    family: str, changes: dict, message: str, tmp_path: Path
) -> None:
    d = write_tiny(family, tmp_path / family)
    _edit_config(d, **changes)
    with pytest.raises(CheckpointError, match=message) as e:
        quicksilver.load(d, device="cpu")
    assert "\n" not in str(e.value)


def test_missing_shard_and_cli_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = write_tiny("llada", tmp_path / "llada")
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="shard model-00002-of-00002.safetensors .* missing"):
        quicksilver.load(d, device="cpu")
    with pytest.raises(SystemExit) as e:
        cli_main(["generate", "hi", "--model", str(d)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("quicksilver: error:") and "\n" not in err and "Traceback" not in err


def test_dream_without_tokenizer_files_is_clear(tmp_path: Path) -> None:
    d = write_tiny("dream", tmp_path / "dream")
    (d / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match="merges.txt"):
        quicksilver.load(d, device="cpu")


def test_meta_device_build_keeps_native_checkpoints_and_tied_embeddings(tmp_path: Path) -> None:
    """build_model now builds on the meta device and assigns the tensors: same logits, ties kept."""
    from quicksilver.models.checkpoint import save_checkpoint
    from quicksilver.models.config import preset
    from quicksilver.models.transformer import Transformer
    from quicksilver.tokenizer import Tokenizer

    tok = Tokenizer.byte_level()
    cfg = preset(
        "tiny",
        vocab_size=320,
        mask_token_id=tok.mask_id,
        tie_embeddings=True,
        attention="block_causal",
        block_size=4,
    )
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    save_checkpoint(model, tok, tmp_path / "native")
    loaded = quicksilver.load(tmp_path / "native", device="cpu").model
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert all(p.requires_grad for p in loaded.parameters())  # trainable after loading
    ids = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_family_decodes_the_same_with_and_without_its_cache(
    family: str, tiny: dict[str, Path]
) -> None:
    """Block-causal families use the exact block cache; the others run uncached (auto)."""
    from quicksilver.sampling import Decoder, SamplerConfig

    pipe = quicksilver.load(tiny[family])
    ids = pipe.tokenizer.encode("hello there, a longer prompt so that several blocks are cached")[
        :40
    ]
    cfg = SamplerConfig(
        max_new_tokens=20, policy="threshold", threshold=0.3, stop_at_eos=False, block_length=None
    )
    mask = pipe.config.mask_token_id
    cached = Decoder(pipe.model, mask, pipe.stop_ids).generate([ids, ids[:17]], cfg)
    plain = Decoder(pipe.model, mask, pipe.stop_ids, use_cache=False).generate([ids, ids[:17]], cfg)
    assert [r.tokens for r in cached] == [r.tokens for r in plain]
