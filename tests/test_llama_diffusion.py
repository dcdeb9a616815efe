"""``bench shapes --vs-llama-cpp`` on the LLaDA slice: the hand-written ``llada`` GGUF (metadata,
tensor names and layouts, read back with the gguf package; no llama.cpp needed) and, where
llama.cpp's programs are built (make llama-server), llama-diffusion-cli beside our block step on
tiny shapes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from quicksilver.bench.llama_diffusion import MASK_TOKEN, llada_vocab, write_llada_gguf
from quicksilver.bench.shapes import random_weights, shape_config
from quicksilver.errors import QuicksilverError
from quicksilver.models.gguf_export import neox_to_interleaved

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = shape_config("llada-8b-slice", tiny=True)
    return write_llada_gguf(cfg, random_weights(cfg), tmp_path_factory.mktemp("llada") / "t.gguf")


def _field(reader: Any, key: str) -> Any:
    return reader.get_field(key).contents()


def test_the_llada_gguf_holds_what_llama_cpps_loader_reads(tiny_gguf: Path) -> None:
    cfg = shape_config("llada-8b-slice", tiny=True)
    r = gguf.GGUFReader(str(tiny_gguf))
    assert _field(r, "general.architecture") == "llada"
    assert _field(r, "llada.block_count") == cfg.n_layers
    assert _field(r, "llada.embedding_length") == cfg.d_model
    assert _field(r, "llada.feed_forward_length") == cfg.mlp_hidden
    assert _field(r, "llada.attention.head_count") == cfg.n_heads
    assert _field(r, "llada.rope.dimension_count") == cfg.dim_head
    assert _field(r, "llada.attention.causal") is False
    assert _field(r, "diffusion.shift_logits") is False
    assert _field(r, "tokenizer.ggml.mask_token_id") == cfg.mask_token_id
    assert _field(r, "tokenizer.ggml.add_bos_token") is False
    tokens = _field(r, "tokenizer.ggml.tokens")
    assert len(tokens) == cfg.vocab_size and tokens[cfg.mask_token_id] == MASK_TOKEN
    layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"}
    layer |= {"ffn_gate", "ffn_up", "ffn_down"}
    want = {"token_embd.weight", "output_norm.weight", "output.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(cfg.n_layers) for n in layer
    }
    assert {t.name for t in r.tensors} == want
    kinds = {t.name: t.tensor_type for t in r.tensors}
    assert kinds["blk.0.ffn_up.weight"] == gguf.GGMLQuantizationType.BF16
    assert kinds["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32


def test_q_and_k_rows_rotate_adjacent_pairs_as_llada_does(tiny_gguf: Path) -> None:
    """Our weights rotate halves of a head; llama.cpp's llada rotates adjacent pairs (its
    converter's undo_permute), so q/k rows are reordered and every other matrix kept as drawn."""
    cfg = shape_config("llada-8b-slice", tiny=True)
    weights = random_weights(cfg)
    r = gguf.GGUFReader(str(tiny_gguf))
    stored = {t.name: t for t in r.tensors}

    def read(name: str) -> torch.Tensor:
        raw = torch.from_numpy(stored[name].data.copy())  # (rows, 2 * cols) uint8 of bf16
        return raw.view(torch.bfloat16)

    q = weights("model.layers.1.self_attn.q_proj.weight")
    assert torch.equal(read("blk.1.attn_q.weight"), neox_to_interleaved(q, cfg.n_heads))
    assert not torch.equal(read("blk.1.attn_q.weight"), q)
    v = weights("model.layers.1.self_attn.v_proj.weight")
    assert torch.equal(read("blk.1.attn_v.weight"), v)


def test_the_placeholder_vocabulary_needs_the_mask_past_the_bytes() -> None:
    cfg = shape_config("llada-8b-slice", tiny=True)
    tokens, types = llada_vocab(cfg)
    assert len(set(tokens)) == len(tokens) == cfg.vocab_size
    assert types[cfg.mask_token_id] == 3 and types[:256] == [1] * 256
    with pytest.raises(QuicksilverError, match="mask token"):
        llada_vocab(dataclasses.replace(cfg, mask_token_id=7))


def _diffusion_cli() -> Path:
    from quicksilver.bench.llama_shapes import llama_tool

    try:
        llama_tool("llama-quantize")
        return llama_tool("llama-diffusion-cli")
    except QuicksilverError:
        pytest.skip("llama.cpp's programs are not built (make llama-server)")


def test_a_prompt_of_p_letters_is_p_tokens(tiny_gguf: Path) -> None:
    """The template echoes the text and no BOS is added: in a 256-position context (llama.cpp's
    least) 255 letters decode and 256 are refused as too long (its exit code: its log may lose
    lines at exit, llama.cpp #22142)."""
    cli = _diffusion_cli()
    cmd = [str(cli), "-m", str(tiny_gguf), "-c", "256", "-ub", "256", "-t", "1", "--no-repack"]
    cmd += ["--diffusion-steps", "1", "--diffusion-block-length", "256"]
    fits = subprocess.run([*cmd, "-p", "a" * 255], capture_output=True, timeout=60)
    too_long = subprocess.run([*cmd, "-p", "a" * 256], capture_output=True, timeout=60)
    assert (fits.returncode, too_long.returncode) == (0, 1)


def test_bench_shapes_sets_llama_diffusion_cli_beside_the_llada_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _diffusion_cli()
    from quicksilver.cli import main

    rc = main(
        ["bench", "shapes", "--tiny", "--shapes", "llada-8b-slice", "--vs-llama-cpp"]
        + ["--formats", "bfloat16", "--windows", "1", "8", "--iters", "1", "--context", "16"]
        + ["--llama-reps", "1", "--threads", "1", "--out", str(tmp_path)]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ratio = rep["vs_llama_cpp"]["llada-8b-slice"]["block_bfloat16_vs_llama_BF16"]
    row = rep["shapes"][0]["formats"][0]
    peer = row["llama_diffusion"]
    assert peer["type"] == "BF16" and peer["canvas"] == 16 + 8 and peer["generated"] == 8
    assert 0 < peer["forward_ms"] <= peer["step_ms"] and peer["peak_rss_bytes"] > 0
    assert ratio == pytest.approx(row["step_ms"]["8"] / peer["forward_ms"], rel=0.01)
    assert (tmp_path / "shapes.png").stat().st_size > 0
