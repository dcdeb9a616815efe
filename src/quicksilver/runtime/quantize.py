"""Weight quantization for CPU serving: ``--quantize int8``.

int8 here is PyTorch's dynamic quantization (``torch.ao.quantization.quantize_dynamic``, the fbgemm /
x86 kernels): weights are stored as int8 with one scale per output channel, activations are quantized on the fly per call
and the matmul runs in int8 with an fp32 result. Measured on this 2-vCPU AVX2 EPYC (docs/LOG.md,
2026-12-01): a 1536 x 8960 linear over 8 positions takes 1.6 ms against 24 ms in fp32 and 8.6 ms in
bf16, while torchao 0.18's int8 weight-only and dynamic configs run 87-95 ms in eager mode on this
CPU and ``torch._weight_int8pack_mm`` is ~4x slower than fp32 — so the well-kept fbgemm path is the
one used, although its eager API is marked for migration to torchao.

What is quantized: every linear layer of the network, the attention's q/k/v and the MLP's gate/up
fused into one int8 linear each (the one matmul the fp32 inference path also runs), and the output
head. Embeddings, norms and mixture-of-experts experts (batched parameter tensors, not linears)
stay in their float dtype. A quantized model is for inference only, on the CPU.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..errors import ConfigError
from ..models.transformer import MLP, Attention
from .runtime import Runtime

QUANTIZE_CHOICES = ("none", "int8")


def _fuse(linears: tuple[nn.Linear, ...]) -> nn.Linear:
    """One float linear whose output is the concatenation of ``linears``' outputs."""
    w = torch.cat([lin.weight.detach() for lin in linears])  # (sum out, in)
    fused = nn.Linear(w.shape[1], w.shape[0], bias=any(lin.bias is not None for lin in linears))
    with torch.no_grad():
        fused.weight.copy_(w)
        if fused.bias is not None:
            fused.bias.copy_(
                torch.cat(
                    [
                        lin.bias.detach()
                        if lin.bias is not None
                        else torch.zeros(lin.out_features, dtype=w.dtype)
                        for lin in linears
                    ]
                )
            )
    return fused


def _drop(module: nn.Module, names: tuple[str, ...]) -> None:
    """Empty the float linears that an int8 one replaced (nn.Module keeps None submodule slots)."""
    for name in names:
        setattr(module, name, None)


def quantize_model(runtime: Runtime, mode: str) -> Runtime:
    """Quantize the runtime's network in place (``mode``: none | int8) and return the runtime."""
    if mode not in QUANTIZE_CHOICES:
        raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {mode!r}")
    if mode == "none":
        return runtime
    model = runtime.net
    device = model.model.embed_tokens.weight.device
    if device.type != "cpu":
        raise ConfigError(f"--quantize int8 runs on the CPU only (the model is on {device})")
    model.float().eval()
    for m in model.modules():
        if isinstance(m, Attention) and m.q_proj is not None:
            m.qkv_int8 = _fuse((m.q_proj, m.k_proj, m.v_proj))
            _drop(m, ("q_proj", "k_proj", "v_proj"))
        elif isinstance(m, MLP) and m.gate_proj is not None:
            m.gate_up_int8 = _fuse((m.gate_proj, m.up_proj))
            _drop(m, ("gate_proj", "up_proj"))
    engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
    torch.backends.quantized.engine = engine
    with warnings.catch_warnings():  # the eager API's migration notice (see the module docstring)
        warnings.simplefilter("ignore")
        spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
        torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)
    runtime.quantized = mode
    return runtime
