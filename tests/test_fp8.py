"""FP8 weights (runtime/fp8.py): the conversion, the scaled matmul against its float32 reference
(``torch._scaled_mm`` runs on this CPU build too), row invariance, and the one-line refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quicksilver.errors import ConfigError
from quicksilver.models import Transformer, preset
from quicksilver.runtime import Runtime
from quicksilver.runtime.fp8 import E4M3_MAX, FP8Linear, fp8_reference, fp8_unsupported, to_fp8
from quicksilver.runtime.quantize import check_mode
from quicksilver.sampling import Decoder
from test_packing import BITWISE
from test_step import _mixed, _prompt


def test_per_channel_scales_round_trip_within_e4m3_precision() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g) * torch.logspace(-3, 1, 48)[:, None]  # (N, K)
    with torch.no_grad():
        ref = nn.Linear(64, 48, bias=False)
        ref.weight.copy_(w)
    lin = FP8Linear(ref)
    assert lin.weight.dtype == torch.float8_e4m3fn and lin.scale.shape == (48,)
    back = lin.weight.float() * lin.scale[:, None]  # (N, K)
    assert torch.allclose(back.abs().amax(-1), w.abs().amax(-1), rtol=1e-6)  # amax exact
    assert ((back - w).abs() <= w.abs().amax(-1, keepdim=True) / E4M3_MAX * 16 + 1e-30).all()
    assert ((back - w).abs() / w.abs().clamp(min=1e-3 * w.abs().amax())).max() < 0.07  # 3 bits


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_equals_the_reference_math(out_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(64, 32, bias=True).to(out_dtype)
    x = torch.randn(7, 5, 64, generator=g).to(out_dtype)  # (B, T, K)
    f8 = FP8Linear(lin)
    with torch.no_grad():
        y = f8(x)  # (B, T, N)
    ref = fp8_reference(x.reshape(-1, 64), f8.weight, f8.scale, torch.float32) + lin.bias.float()
    assert y.shape == (7, 5, 32) and y.dtype == out_dtype
    tol = 1e-5 if out_dtype == torch.float32 else 2e-2
    assert torch.allclose(y.reshape(-1, 32).float(), ref, atol=tol, rtol=tol)
    full = x.reshape(-1, 64).float() @ lin.weight.float().t() + lin.bias.float()
    assert (y.reshape(-1, 32).float() - full).abs().max() < 0.1 * full.abs().max()


def test_a_row_keeps_its_numbers_in_any_batch() -> None:
    """Activations are scaled per token: a row's output never sees its batch-mates."""
    g = torch.Generator().manual_seed(2)
    f8 = FP8Linear(nn.Linear(64, 48))
    x = torch.randn(9, 64, generator=g)
    x[3] *= 100.0  # a loud neighbour would shift a per-tensor scale
    with torch.no_grad():
        together, alone = f8(x), torch.cat([f8(x[i : i + 1]) for i in range(9)])
    if BITWISE:
        assert torch.equal(together, alone)
    else:
        assert torch.allclose(together, alone, atol=1e-6)


def test_a_network_in_fp8_decodes_close_to_bf16() -> None:
    torch.manual_seed(0)
    cfg = preset("tiny", vocab_size=96, attention="block_causal", block_size=8, mlp_hidden=176)
    net = Transformer(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(3, 96, (2, 24))
    with torch.no_grad():
        ref = net(ids).float()
        n = to_fp8(net)  # what quantize(runtime, "fp8") does on a GPU
        got = net(ids).float()
    assert n == 2 * cfg.n_layers * 2 + 1  # qkv, o, gate_up, down per layer, and the head
    assert isinstance(net.lm_head, FP8Linear) and net.model.layers[0].self_attn.q_proj is None
    cos = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0)
    assert cos > 0.995
    dec = Decoder(Runtime(net), 2, [1], vocab_limit=96)
    res = dec.generate([_prompt(0)], _mixed(0).replace(temperature=0.0, max_new_tokens=8))
    assert len(res[0].tokens) == 8


def test_fp8_is_refused_in_one_line_where_the_device_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="FP8 tensor cores") as e:
        check_mode("fp8", torch.device("cpu"), "torch", False)
    assert "\n" not in str(e.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    why = fp8_unsupported(torch.device("cuda"))
    assert why is not None and "A100 is 8.0" in why and "\n" not in why
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    assert fp8_unsupported(torch.device("cuda")) is None
    check_mode("fp8", torch.device("cuda"), "torch", False)
    with pytest.raises(ConfigError, match="dense"):
        check_mode("fp8", torch.device("cuda"), "torch", True)
