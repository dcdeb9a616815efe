"""--quantize int8|int4 (weight-only, on OpenVINO's kernels; MoE networks: tests/test_moe_quantize.py) and
`quicksilver bench shapes` (random weights)."""

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
from quicksilver.models import Transformer, preset
from quicksilver.models.kvcache import KVCache
from quicksilver.runtime import Runtime, Segment
from quicksilver.runtime.ov_graph import graph_step, quantize_groups, state_weights
from quicksilver.runtime.quantize import quantize
from quicksilver.sampling.decoders.autoregressive import ar_generate

PROMPT = [{"role": "user", "content": "What is 23 times 47?"}]


def _teacher_forced(runtime: Runtime, ids: list[int]) -> torch.Tensor:
    """Logits (len(ids), V) of the prompt and reply: a prefill, then one token a pass."""
    cache, out = KVCache(), []
    with torch.no_grad():
        out.append(
            runtime.forward_segments([Segment(torch.tensor(ids[:8]), 0, 0, 8, cache, append=8)])[0]
        )
        for j in range(8, len(ids)):
            seg = Segment(torch.tensor(ids[j : j + 1]), j, 0, 1, cache, append=1)
            out.append(runtime.forward_segments([seg])[0])
    return torch.cat(out)


@pytest.mark.parametrize("mode,rel,agree", [("int8", 0.05, 0.95), ("int4", 0.25, 0.85)])
def test_quantized_weights_run_every_pass_in_the_graph_and_stay_close(
    mode: str, rel: float, agree: float
) -> None:
    """Every pass of a quantized dense model runs in its OpenVINO graph (none in torch), and its
    logits stay close to the float model's on the float model's own greedy reply."""
    path = embedded_ar_model_path()
    assert path is not None
    ref, q = quicksilver.load(path), quicksilver.load(path, quantize=mode)
    assert q.runtime.quantized == mode and q.runtime_name == f"openvino-{mode}"  # GRAPH_NAMES
    prompt = ref.encode_prompt(PROMPT, True)
    reply = ar_generate(ref.runtime, prompt, 48, ref.tokenizer.stop_ids).tokens
    torch_passes = []
    q.runtime._forward_packed = lambda segs: torch_passes.append(segs) or []  # type: ignore[method-assign]
    a, b = _teacher_forced(ref.runtime, prompt + reply), _teacher_forced(q.runtime, prompt + reply)
    assert not torch_passes and not torch.equal(a, b)  # it really runs quantized, never in torch
    assert (a - b).norm() / a.norm() < rel
    mine = slice(len(prompt) - 1, a.shape[0] - 1)  # the positions that chose the reply
    assert (a[mine].argmax(-1) == b[mine].argmax(-1)).float().mean() >= agree


def test_graph_in_float32_equals_torch_for_every_pattern() -> None:
    """The step graph itself (float32 weights) is the network: bidirectional with the logit shift
    and partial rotary, block-causal with QK-norm, GQA and q/k/v bias, causal; a prefill, then a
    pass against the cache."""
    cases = [
        dict(attention="causal"),
        dict(attention="block_causal", qk_norm=True, qkv_bias=True, n_kv_heads=2, block_size=8),
        dict(attention="bidirectional", logit_shift=True, partial_rotary_factor=0.5),
    ]
    for kw in cases:
        torch.manual_seed(0)
        net = Transformer(preset("tiny", vocab_size=256, **kw)).eval()  # type: ignore[arg-type]
        ids = torch.randint(3, 256, (20,))

        def run(rt: Runtime, ids: torch.Tensor = ids) -> torch.Tensor:
            cache = KVCache()
            with torch.no_grad():
                a = rt.forward_segments([Segment(ids[:16], 0, 0, 16, cache, append=16)])[0]
                b = rt.forward_segments([Segment(ids[16:], 16, 0, 4, cache, append=4)])[0]
            return torch.cat([a, b])

        graph = Runtime(net)
        graph.attach(graph_step(net.config, state_weights(net), "float32", 1))
        assert (run(graph) - run(Runtime(net))).abs().max() < 1e-4, kw


def test_int4_groups_round_to_the_nearest_level() -> None:
    w = torch.randn(8, 256)
    q, scale = quantize_groups(w, 4, 128)
    assert q.shape == (8, 2, 128) and scale.shape == (8, 2, 1)
    assert q.min() >= -8 and q.max() <= 7
    back = torch.from_numpy(q * scale.astype("float32")).reshape(8, 256)
    step = torch.from_numpy(scale.astype("float32")).repeat_interleave(128, 1).reshape(8, 256)
    assert ((back - w).abs() <= step / 2 + 1e-3).all()


def test_quantized_models_decode_diffusion_and_ar() -> None:
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    diff, ar = embedded_diffusion_model_path(), embedded_ar_model_path()
    assert diff is not None and ar is not None
    ref, q = quicksilver.load(diff), quicksilver.load(diff, quantize="int8")
    assert q.generate(chat, max_new_tokens=32).text == ref.generate(chat, max_new_tokens=32).text
    ids = ref.encode_prompt(chat, True)
    a_ref, a_q = quicksilver.load(ar), quicksilver.load(ar, quantize="int4")
    stops = a_ref.tokenizer.stop_ids
    out = ar_generate(a_q.runtime, ids, 24, stops).tokens
    assert out and len(out) == len(ar_generate(a_ref.runtime, ids, 24, stops).tokens)


def test_quantize_refuses_unknown_modes_other_devices_and_other_backends() -> None:
    path = embedded_ar_model_path()
    assert path is not None
    with pytest.raises(ConfigError, match="int4"):
        quicksilver.load(path, quantize="int3")
    for backend in ("onnx", "openvino-bf16"):
        with pytest.raises(ConfigError, match="OpenVINO"):
            quicksilver.load(path, quantize="int4", backend=backend)
    model = quicksilver.load(path).model.to("meta")
    with pytest.raises(ConfigError, match="CPU only"):
        quantize(Runtime(model), "int8")


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
    assert [f["format"] for f in fmt] == ["float32", "bfloat16", "graph-bf16", "int8", "int4"]
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


def test_bf16_weights_under_auto_run_in_the_graph_on_a_cpu_without_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a CPU without bf16 arithmetic a bf16 dense model under ``--backend auto`` runs its bf16
    weights on OpenVINO's kernels (no emulation), straight from the files; torch stays torch, and
    a CPU with bf16 keeps torch's native bf16."""
    import quicksilver.runtime.quantize as q

    path = embedded_ar_model_path()
    assert path is not None
    monkeypatch.setattr(q, "native_bf16", lambda: True)
    assert quicksilver.load(path, dtype="bfloat16", backend="auto").runtime_name != (
        "openvino-bf16-weights"
    )
    monkeypatch.setattr(q, "native_bf16", lambda: False)
    auto = quicksilver.load(path, dtype="bfloat16", backend="auto")
    eager = quicksilver.load(path, dtype="bfloat16", backend="torch")
    assert auto.runtime_name == "openvino-bf16-weights" and auto.runtime.quantized == "bf16"
    assert eager.runtime_name == "torch"
    prompt = eager.encode_prompt(PROMPT, True)
    reply = ar_generate(eager.runtime, prompt, 32, eager.tokenizer.stop_ids).tokens
    a = _teacher_forced(eager.runtime, prompt + reply).float()
    b = _teacher_forced(auto.runtime, prompt + reply)
    assert (a - b).norm() / a.norm() < 0.05
