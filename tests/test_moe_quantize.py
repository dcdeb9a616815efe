"""Mixture-of-experts networks quantized on the CPU (runtime/weight_only.py) and grouped experts
(models/moe.py): tiny shapes, random weights.

Tolerances (relative L2 error of outputs against float32, random N(0, 0.02-0.1) weights): a packed
linear int8 < 0.02, int4 < 0.15; a whole tiny network's logits int8 < 0.05, int4 < 0.3 (bf16
activations included). Grouped experts equal the loop to float32 rounding.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import quicksilver
from family_fixtures import write_tiny
from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.models.config import MoEConfig
from quicksilver.models.families.diffusion_gemma import gemma_config
from quicksilver.models.families.diffusion_gemma_net import DiffusionGemmaLM, GemmaKVCache
from quicksilver.models.lazy_state import LazyState
from quicksilver.models.moe import MoE, StackedExperts
from quicksilver.runtime import Runtime
from quicksilver.runtime.quantize import quantize
from quicksilver.runtime.weight_only import QLinear, QuantExpert, group_size, pack, quantize_tree


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("k", [256, 96, 64])
def test_packed_linears_are_close_to_float(k: int) -> None:
    torch.manual_seed(0)
    w, b, x = torch.randn(48, k) * 0.05, torch.randn(48) * 0.1, torch.randn(5, 3, k)
    ref = F.linear(x, w, b)  # (5, 3, 48)
    assert group_size(k) == {256: 128, 96: 32, 64: 64}[k]
    for fmt, tol in (("int8", 0.02), ("int4", 0.15)):
        y = pack(w, fmt, b)(x)
        assert y.shape == ref.shape and y.dtype == x.dtype
        assert _rel(y, ref) < tol, fmt
    with pytest.raises(ConfigError, match="multiple of 32"):
        pack(torch.randn(16, 40), "int4")


def _moe_net(**over: object) -> Transformer:
    moe = MoEConfig(
        n_experts=8,
        top_k=2,
        expert_hidden=64,
        shared_hidden=64,
        layers=[1],
        score="sigmoid",
        n_group=4,
        topk_group=2,
        expert_bias="select",
        scale=2.5,
    )
    cfg = preset(
        "tiny", vocab_size=256, d_model=128, n_heads=4, n_kv_heads=2, mlp_hidden=128,
        n_layers=2, qk_norm=True, partial_rotary_factor=0.5, attention="block_causal",
        block_size=4, moe=moe, **over,
    )  # fmt: skip
    torch.manual_seed(0)
    return Transformer(cfg).eval()


@pytest.mark.parametrize("fmt,tol,agree", [("int8", 0.05, 0.9), ("int4", 0.3, 0.6)])
def test_quantized_moe_network_stays_close_to_float(fmt: str, tol: float, agree: float) -> None:
    """Every linear packed (experts, shared expert, attention, dense MLP, head), routers float."""
    net = _moe_net()
    ids = torch.randint(3, 256, (1, 12))
    with torch.no_grad():
        ref = net(ids)  # (1, T, V)
        rt = quantize(Runtime(copy.deepcopy(net)), fmt)
        out = rt.net(ids)
    assert rt.quantized == fmt and rt.step_backend is None
    assert not [m for m in rt.net.modules() if isinstance(m, nn.Linear)]
    assert sum(isinstance(m, QuantExpert) for m in rt.net.modules()) == 8 + 1  # + shared
    assert _rel(out, ref) < tol
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() >= agree


def test_quantized_diffusion_gemma_network_stays_close_to_float() -> None:
    cj = {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "canvas_length": 8,
        "text_config": {
            "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96,
            "moe_intermediate_size": 32, "num_experts": 4, "top_k_experts": 2,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 32, "global_head_dim": 64, "num_global_key_value_heads": 1,
            "sliding_window": 8,
        },
    }  # fmt: skip
    torch.manual_seed(0)
    net = DiffusionGemmaLM(gemma_config(Path("<test>"), cj)).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    q = copy.deepcopy(net)
    quantize_tree(q, q.state_dict().__getitem__, "int8")
    ids, canvas = torch.randint(3, 320, (1, 6)), torch.randint(3, 320, (1, 8))

    def run(m: DiffusionGemmaLM) -> torch.Tensor:
        cache = GemmaKVCache()
        with torch.no_grad():
            m.encode(ids, cache)
            return m.decode(canvas, cache)

    assert isinstance(q.layers[0].self_attn.q_proj, QLinear)
    assert _rel(run(q), run(net)) < 0.05


def test_int4_moe_load_reads_the_checkpoint_lazily(tmp_path: Path) -> None:
    """``--quantize int4`` of a tiny LLaDA2 checkpoint: built from the lazily read files (the fused
    q/k/v split without reading it whole), each tensor read once, the same network as the float
    load packed in memory; refused with a step backend other than torch."""
    path = write_tiny("llada2", tmp_path / "m", hidden=128, ffn=128, expert_ffn=64, vocab=320)
    reads: list[str] = []
    get = LazyState.__getitem__

    def spy(self: LazyState, name: str) -> torch.Tensor:
        reads.append(name)
        return get(self, name)

    ref = quicksilver.load(path)
    LazyState.__getitem__ = spy  # type: ignore[method-assign]
    try:
        q = quicksilver.load(path, quantize="int4")
    finally:
        LazyState.__getitem__ = get  # type: ignore[method-assign]
    assert len(reads) == len(set(reads)), sorted(n for n in reads if reads.count(n) > 1)
    assert any(n.endswith("self_attn.q_proj.weight") for n in reads)
    assert q.runtime.quantized == "int4"
    ids = torch.randint(3, 320, (1, 8))
    with torch.no_grad():
        a, b = ref.model(ids), q.model(ids)
        assert _rel(b, a) < 0.4  # the fixture's weights are N(0, 0.1), its embeddings N(0, 1)
        same = quantize(Runtime(ref.model), "int4").net(ids)  # packed in memory instead
    torch.testing.assert_close(b, same, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="torch"):
        quicksilver.load(path, quantize="int4", backend="onnx")


def test_grouped_experts_equal_the_loop() -> None:
    """One grouped GEMM per projection (torch._grouped_mm, whose CPU reference kernel runs here)
    equals the loop over active experts, including experts that got no token."""
    torch.manual_seed(0)
    bank = StackedExperts(6, 32, 16)
    x = torch.randn(10, 32)
    experts = torch.randint(0, 4, (10, 2))  # experts 4 and 5 get nothing
    weights = torch.rand(10, 2)
    loop = bank(x, experts, weights)
    grouped = bank(x, experts, weights, grouped=True)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-6)
    net = _moe_net()
    moe = net.model.layers[1].mlp
    assert isinstance(moe, MoE)
    x3 = torch.randn(2, 5, 128)
    with torch.no_grad():
        before = moe(x3)
        moe.stack_experts()
        assert isinstance(moe.experts, StackedExperts)
        torch.testing.assert_close(moe(x3), before)  # stacked, looped on the CPU
        flat = x3.reshape(10, 128)
        e, w = moe.gate(flat)
        torch.testing.assert_close(
            moe.experts(flat, e, w, grouped=True), moe.experts(flat, e, w), rtol=1e-5, atol=1e-6
        )


def test_bench_shapes_runs_the_llada2_mini_shape_quantized(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from quicksilver.cli import main

    argv = ["bench", "shapes", "--tiny", "--shapes", "llada2-mini", "--formats", "int4"]
    assert main([*argv, "--windows", "1", "8", "--iters", "1", "--context", "16"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = line["shapes"][0]["formats"][0]
    assert row["format"] == "int4" and row["step_ms"]["8"] > 0
    with pytest.raises(SystemExit):
        main([*argv[:-1], "bfloat16", "--iters", "1"])
    assert "int8 or int4" in capsys.readouterr().err


def test_moe_shape_checkpoint_layout_is_the_published_one(tmp_path: Path) -> None:
    """The written LLaDA2-mini layout (2 layers) loads through the family loader, int8."""
    from quicksilver.bench.moe_shapes import shape_checkpoint, shards

    cj, layout = shape_checkpoint("llada2-mini", 20)
    params = sum(torch.Size(s).numel() for _, s in layout)
    assert 16.0e9 < params < 16.5e9  # 16B total
    assert "model.layers.5.mlp.experts.255.down_proj.weight" in dict(layout)
    assert len(list(shards(layout))) == 8
    _, gemma = shape_checkpoint("diffusiongemma-26b-a4b", None)
    assert 25e9 < sum(torch.Size(s).numel() for _, s in gemma) < 27e9
