"""GGUF export: names, layouts and vocabulary as llama.cpp reads them, proved by a from-scratch
forward over the exported file with llama.cpp's conventions (adjacent-pair RoPE) that matches
quicksilver's logits; and, where llama-cpp-python is installed (`make test-llama-cpp`), llama.cpp's own
logits and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from quicksilver.assets import (
    embedded_ar_model_path,
    embedded_diffusion_model_path,
)
from quicksilver.errors import ConfigError
from quicksilver.models.checkpoint import load_checkpoint
from quicksilver.models.gguf_export import export_gguf, neox_to_interleaved
from quicksilver.sampling.decoders.autoregressive import ar_generate

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    src = embedded_ar_model_path()
    assert src is not None
    out = tmp_path_factory.mktemp("gguf") / "ar.gguf"
    export_gguf(src, out, "f32")
    return src, out


def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_pairs(x: np.ndarray, theta: float) -> np.ndarray:
    """llama.cpp's normal RoPE: rotate (x[2i], x[2i+1]) of each head by pos * theta^(-2i/d)."""
    T, H, d = x.shape
    ang = np.arange(T)[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]  # (T, d/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def gguf_forward(path: Path, ids: list[int]) -> np.ndarray:
    """Logits (T, V) of a llama-architecture GGUF, computed from its tensors and metadata alone."""
    r = gguf.GGUFReader(str(path))
    f = {k: v.parts[v.data[0]] for k, v in r.fields.items() if v.data}
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in r.tensors}
    n_layers, H = int(f["llama.block_count"][0]), int(f["llama.attention.head_count"][0])
    Hkv, eps = (
        int(f["llama.attention.head_count_kv"][0]),
        float(f["llama.attention.layer_norm_rms_epsilon"][0]),
    )
    theta = float(f["llama.rope.freq_base"][0])
    x = t["token_embd.weight"][ids]  # (T, C)
    T, C = x.shape
    d = C // H
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(n_layers):
        p = lambda n, i=i: t[f"blk.{i}.{n}.weight"]  # noqa: E731
        h = rms(x, p("attn_norm"), eps)
        q = rope_pairs((h @ p("attn_q").T).reshape(T, H, d), theta)
        k = rope_pairs((h @ p("attn_k").T).reshape(T, Hkv, d), theta).repeat(H // Hkv, 1)
        v = (h @ p("attn_v").T).reshape(T, Hkv, d).repeat(H // Hkv, 1)
        att = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + causal
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + np.einsum("hqk,khd->qhd", att, v).reshape(T, C) @ p("attn_output").T
        h = rms(x, p("ffn_norm"), eps)
        g = h @ p("ffn_gate").T
        x = x + ((g / (1 + np.exp(-g))) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    return rms(x, t["output_norm.weight"], eps) @ t["output.weight"].T


def test_exported_file_computes_the_same_logits(exported: tuple[Path, Path]) -> None:
    src, out = exported
    model, tok = load_checkpoint(src)
    ids = tok.encode("<|im_start|>user\nWhat is 347*12?<|im_end|>\n<|im_start|>assistant\n")
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].double().numpy()  # (T, V)
    theirs = gguf_forward(out, ids)
    assert (
        np.abs(ours - theirs).max() < 1e-4
    )  # measured 1.3e-5 (float64 reference of the GGUF tensors)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


def test_metadata_and_vocabulary(exported: tuple[Path, Path]) -> None:
    src, out = exported
    _, tok = load_checkpoint(src)
    r = gguf.GGUFReader(str(out))
    tokens = r.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == tok.vocab_size
    im_end = tok.token_to_id("<|im_end|>")
    assert bytes(tokens.parts[tokens.data[im_end]]).decode() == "<|im_end|>"
    assert len(r.fields["tokenizer.ggml.merges"].data) > 100
    assert bytes(r.fields["general.architecture"].parts[-1]).decode() == "llama"


def test_rope_reorder_is_a_per_head_permutation() -> None:
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(16, 3)  # 2 heads of 8, 3 inputs
    p = neox_to_interleaved(w, 2)
    assert torch.equal(p[:8:2], w[:4]) and torch.equal(
        p[1:8:2], w[4:8]
    )  # head 0: halves interleaved
    assert torch.equal(p[8:].sort(0).values, w[8:].sort(0).values)


def test_diffusion_checkpoints_are_refused(tmp_path: Path) -> None:
    src = embedded_diffusion_model_path()
    assert src is not None
    with pytest.raises(ConfigError, match="only causal"):
        export_gguf(src, tmp_path / "x.gguf")
    with pytest.raises(ConfigError, match="--dtype"):
        export_gguf(src, tmp_path / "x.gguf", "q4")


def test_llama_cpp_runs_the_export(exported: tuple[Path, Path]) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason="optional: make test-llama-cpp")
    src, out = exported
    model, tok = load_checkpoint(src)
    ids = tok.encode(
        "<|im_start|>user\nSolve the sudoku: 1.3./..1./.1../3...<|im_end|>\n<|im_start|>assistant\n"
    )
    llm = llama_cpp.Llama(  # f32 KV cache (type 0): llama.cpp's default f16 one rounds to ~1e-3
        model_path=str(out),
        n_ctx=384,
        logits_all=True,
        verbose=False,
        n_threads=1,
        type_k=0,
        type_v=0,
    )
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)])
    with torch.no_grad():
        ours = model(torch.tensor([ids]))[0].float().numpy()
    assert np.abs(ours - theirs).max() < 1e-4
    stops = [*model.config.eos_token_ids, *tok.stop_ids]
    greedy = []
    for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
        if t in stops or len(greedy) == 40:
            break
        greedy.append(t)
    assert greedy == ar_generate(model, ids, 40, stops).tokens
