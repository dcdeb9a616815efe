"""FP8 weights on GPUs with FP8 tensor cores: ``--quantize fp8``.

Contract:

- Weights: every linear of a dense network's blocks (q/k/v fused, o, gate/up fused, down) and an
  untied head become ``FP8Linear``: float8 e4m3 weights, one float32 scale per output channel
  (``amax / 448``, the format's largest finite value). Embeddings and norms keep their dtype; a
  linear whose widths are not multiples of 16 (what ``torch._scaled_mm`` takes) stays as it was.
- Activations: one dynamic scale per token (row), the same e4m3 rounding, so a row's output never
  depends on its batch-mates.
- The product: ``torch._scaled_mm(x8, w8.T, scale_a (M, 1), scale_b (1, N), out_dtype)`` with fp32
  accumulation on the GPU; ``fp8_reference`` is the same math spelled in float32, which the fused
  call must equal to its accumulation order (tests run both on the CPU, where torch has the op).
- ``fp8_unsupported(device)`` says in one line why a device cannot run it (anything but an NVIDIA
  GPU of compute capability 8.9+: Ada, Hopper, Blackwell), or None. bf16 stays the default and the
  reference; mixture-of-experts networks keep their experts as they are (models/moe.py).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.transformer import MLP, Attention, Transformer

E4M3_MAX = 448.0  # largest finite float8 e4m3fn value
MIN_SCALE = 1e-12  # an all-zero row or channel keeps a usable scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) -> e4m3 values (M, K) and per-row float32 scales (M, 1): x ~= q * scale."""
    scale = x.abs().amax(-1, keepdim=True).float().clamp(min=MIN_SCALE) / E4M3_MAX  # (M, 1)
    q = (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)  # (M, K)
    return q, scale


def fp8_reference(
    x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """The math of ``FP8Linear`` in float32: x (M, K), w8 (N, K) e4m3, w_scale (N,) -> (M, N)."""
    x8, x_scale = quantize_rows(x)
    return ((x8.float() * x_scale) @ (w8.float() * w_scale[:, None]).t()).to(out_dtype)


class FP8Linear(nn.Module):
    """A linear layer with e4m3 weights and per-channel scales (see the module docstring)."""

    weight: torch.Tensor  # (N, K) float8_e4m3fn
    scale: torch.Tensor  # (N,) float32
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()  # (N, K)
        w8, scale = quantize_rows(w)
        self.register_buffer("weight", w8)
        self.register_buffer("scale", scale[:, 0])  # (N,)
        b = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", b)
        self.out_dtype = w.dtype
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) -> (..., N) in the original weight dtype."""
        lead = x.shape[:-1]
        x8, x_scale = quantize_rows(x.reshape(-1, self.in_features))  # (M, K), (M, 1)
        y = torch._scaled_mm(
            x8,
            self.weight.t(),
            scale_a=x_scale,
            scale_b=self.scale[None],
            out_dtype=self.out_dtype,
        )  # (M, N)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)


def fits(linear: nn.Linear) -> bool:
    """Widths ``torch._scaled_mm`` takes (multiples of 16)."""
    return linear.in_features % 16 == 0 and linear.out_features % 16 == 0


def fused(linears: tuple[nn.Linear, ...]) -> nn.Linear:
    """One linear whose output is the concatenation of ``linears``' outputs (same dtype/device)."""
    w = torch.cat([lin.weight.detach() for lin in linears])  # (sum N, K)
    out = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    out.weight.data.copy_(w)
    if any(lin.bias is not None for lin in linears):
        zeros = [torch.zeros(lin.out_features, dtype=w.dtype, device=w.device) for lin in linears]
        parts = [
            zero if lin.bias is None else lin.bias.detach() for lin, zero in zip(linears, zeros)
        ]
        out.bias = nn.Parameter(torch.cat(parts))
    return out


def to_fp8(net: Transformer) -> int:
    """Convert the network's linears in place (see the module docstring); how many became FP8."""
    n = 0
    for m in net.modules():
        if isinstance(m, Attention) and m.q_proj is not None:
            qkv = fused((m.q_proj, m.k_proj, m.v_proj))
            if fits(qkv):
                m.qkv_quant = FP8Linear(qkv)  # the slot of a quantized fused q/k/v (transformer.py)
                m.q_proj = m.k_proj = m.v_proj = None  # type: ignore[assignment]
                n += 1
            if fits(m.o_proj):
                m.o_proj = FP8Linear(m.o_proj)  # type: ignore[assignment]
                n += 1
        elif isinstance(m, MLP) and m.gate_proj is not None:
            gate_up = fused((m.gate_proj, m.up_proj))
            if fits(gate_up):
                m.gate_up_quant = FP8Linear(gate_up)
                m.gate_proj = m.up_proj = None  # type: ignore[assignment]
                n += 1
            if fits(m.down_proj):
                m.down_proj = FP8Linear(m.down_proj)  # type: ignore[assignment]
                n += 1
    if not net.config.tie_embeddings and fits(net.lm_head):
        net.lm_head = FP8Linear(net.lm_head)  # type: ignore[assignment]
        n += 1
    return n


def fp8_unsupported(device: torch.device) -> str | None:
    """Why ``--quantize fp8`` cannot run on ``device`` (one line), or None where it can."""
    if device.type != "cuda":
        return (
            f"--quantize fp8 needs an NVIDIA GPU with FP8 tensor cores (compute capability 8.9+: "
            f"Ada, Hopper, Blackwell); the model is on {device.type} (CPUs: int8 or int4)"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return f"--quantize fp8 needs compute capability 8.9+ (FP8 tensor cores); {name} is {major}.{minor}"
    return None
