"""--quantize int8 (dynamic int8 linear layers) and `quicksilver bench shapes` (random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import quicksilver
from quicksilver.assets import (
    embedded_ar_model_path,
    embedded_diffusion_model_path,
)
from quicksilver.errors import ConfigError
from quicksilver.runtime import Runtime
from quicksilver.runtime.quantize import quantize_model
from quicksilver.sampling.autoregressive import ar_generate

PROMPT = [{"role": "user", "content": "What is 23 times 47?"}]


def _linear_kinds(model: torch.nn.Module) -> set[type]:
    kinds = (torch.nn.Linear, torch.ao.nn.quantized.dynamic.Linear)
    return {type(m) for m in model.modules() if isinstance(m, kinds)}


def test_int8_replaces_every_linear_and_stays_close_to_float() -> None:
    path = embedded_ar_model_path()
    assert path is not None
    ref = quicksilver.load(path)
    q = quicksilver.load(path, quantize="int8")
    assert _linear_kinds(ref.model) == {torch.nn.Linear}
    assert _linear_kinds(q.model) == {torch.ao.nn.quantized.dynamic.Linear}  # the head too
    attn = q.model.model.layers[0].self_attn
    assert attn.q_proj is None and attn.qkv_int8 is not None  # q, k, v fused into one int8 matmul
    prompt = ref.encode_prompt(PROMPT, True)
    reply = ar_generate(ref.model, prompt, 48, ref.tokenizer.stop_ids).tokens
    ids = torch.tensor([prompt + reply])  # (1, T): the float model's own greedy reply
    with torch.no_grad():
        a, b = ref.model(ids), q.model(ids)  # (1, T, V)
    assert not torch.equal(a, b)  # it really runs in int8
    rel = (a - b).norm() / a.norm()
    assert rel < 0.1, rel
    mine = slice(len(prompt) - 1, ids.shape[1] - 1)  # the positions that chose the reply
    assert (a[0, mine].argmax(-1) == b[0, mine].argmax(-1)).float().mean() >= 0.9


def test_int8_decodes_diffusion_and_ar() -> None:
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    diff, ar = embedded_diffusion_model_path(), embedded_ar_model_path()
    assert diff is not None and ar is not None
    ref, q = quicksilver.load(diff), quicksilver.load(diff, quantize="int8")
    assert q.generate(chat, max_new_tokens=32).text == ref.generate(chat, max_new_tokens=32).text
    ids = ref.encode_prompt(chat, True)
    a_ref, a_q = quicksilver.load(ar), quicksilver.load(ar, quantize="int8")
    stops = a_ref.tokenizer.stop_ids
    out = ar_generate(a_q.model, ids, 24, stops).tokens
    assert out and len(out) == len(ar_generate(a_ref.model, ids, 24, stops).tokens)


def test_quantize_refuses_unknown_modes_and_other_devices() -> None:
    path = embedded_ar_model_path()
    assert path is not None
    with pytest.raises(ConfigError, match="int8"):
        quicksilver.load(path, quantize="int4")
    model = quicksilver.load(path).model.to("meta")
    with pytest.raises(ConfigError, match="CPU only"):
        quantize_model(Runtime(model), "int8")


def test_bench_shapes_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quicksilver.cli import main

    rc = main(
        ["bench", "shapes", "--tiny", "--shapes", "fast-dllm-v2-1.5b,llada-8b-slice"]
        + ["--windows", "1", "4", "8", "--iters", "1", "--context", "16", "--out", str(tmp_path)]
        + ["--verify-tpf", "4:2.5,8:3.0", "--verify-wide", "0.25"]
    )
    assert rc == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["random_weights"] is True and rep["step_vs_ar_token"] > 0
    assert [s["shape"] for s in rep["shapes"]] == ["fast-dllm-v2-1.5b", "llada-8b-slice"]
    fmt = rep["shapes"][0]["formats"]
    assert [f["format"] for f in fmt] == ["float32", "bfloat16", "int8"]
    assert rep["headline_format"] == "float32"  # a tiny model: float32, the small-model default
    assert rep["step_vs_ar_token"] == fmt[0]["step_vs_ar_token"]["8"]
    assert set(fmt[0]["step_ms"]) == {"1", "4", "8"} and set(fmt[0]["tok_s_at_k"]) == set(
        "12345678"
    )
    assert (tmp_path / "shapes.png").stat().st_size > 0
    # the projection divides each k's own tokens per pass by its wide pass's cost in AR tokens
    f = fmt[0]
    for k, tpf in (("4", 2.5), ("8", 3.0)):
        want = tpf / (f["verify_pass_ms"][k] / f["ar_token_ms"])
        assert f["verify_projected_vs_ar"][k] == pytest.approx(want, abs=0.02)
        mix = 0.25 * f["verify_vs_ar_token"][k] + 0.75 * f["verify_lean_vs_ar_token"][k]
        assert f["verify_projected_gated_vs_ar"][k] == pytest.approx(tpf / mix, rel=0.02)


def test_bench_shapes_verify_tpf_is_one_figure_or_pairs() -> None:
    import argparse

    from quicksilver.bench.shapes import fraction, verify_tpf

    assert verify_tpf("3.2") == {"4": 3.2, "8": 3.2}
    assert verify_tpf("4:2.9, 8:3.3") == {"4": 2.9, "8": 3.3}
    for bad in ("fast", "4:x", "8:0", "4:2:1"):
        with pytest.raises(argparse.ArgumentTypeError):
            verify_tpf(bad)
    for bad in ("x", "-0.1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            fraction(bad)


def test_bench_shapes_refuses_a_window_it_does_not_measure(tmp_path: Path) -> None:
    import argparse

    from quicksilver.bench.shapes import add_arguments, run

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(ConfigError, match="--window"):
        run(
            p.parse_args(["--tiny", "--windows", "1", "4", "--window", "8", "--out", str(tmp_path)])
        )


def test_int8_runs_in_torch_under_auto_and_refuses_the_exported_step() -> None:
    path = embedded_ar_model_path()
    assert path is not None
    assert quicksilver.load(path, quantize="int8", backend="auto").runtime.step_backend is None
    with pytest.raises(ConfigError, match="int8"):
        quicksilver.load(path, quantize="int8", backend="onnx")
