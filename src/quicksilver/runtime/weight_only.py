"""Weight-only int8 / int4 linears and experts on torch's CPU kernels, made tensor by tensor.

The contract: ``pack(w, fmt)`` turns a float weight (N, K) into a ``QLinear`` whose forward is
``x @ w.T`` (+ bias) with the weight stored int8 (one scale per output channel:
``torch._weight_int8pack_mm``) or int4 (asymmetric, one bf16 scale and zero per group of 128 inputs,
64 or 32 where 128 does not divide K: ``aten._weight_int4pack_mm_for_cpu``); activations run in
bf16 (the kernels' fast path on the CPU: in float32 they are 10-30x slower). ``quantize_tree``
swaps every linear of a network for one, ``QuantExpert`` / ``QuantExperts`` hold routed experts
(gate and up as one packed matmul, the tokens grouped by expert and one call per active expert:
models/moe.py), each weight read through ``read(name)`` when it is packed and let go, so a network
built on the meta device goes from a lazily read checkpoint to its quantized form holding one
float tensor at a time (``load_quantized``).

Why these kernels (docs/LOG.md, 2026-12-08): at the expert shapes of LLaDA2-mini (2048 -> 2x512)
and DiffusionGemma-26B-A4B (2816 -> 2x704), one thread, torch's int4 / int8 kernels take 0.33-0.40x
/ 0.42-0.43x the time of a bf16 matmul at one token per expert (what an 8-position step gives most
active experts); their time grows with the tokens, past bf16's from about 8 per expert. A compiled
OpenVINO expert was faster at every count, but needs one compiled model per expert (4,864 at
LLaDA2-mini). Routers and norms stay in float (bf16, routing in fp32).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..models.families.diffusion_gemma_net import GemmaRouter
from ..models.moe import ExpertMLP, ExpertSlots, Router, StackedExperts, expert_loop, sort_by_expert
from ..models.transformer import MLP, Attention
from .ov_graph import release_freed_memory

FORMATS = ("int8", "int4")
GROUPS = (128, 64, 32)  # int4 group sizes, the largest that divides a linear's inputs
COMPUTE = torch.bfloat16  # the kernels' activation dtype
SLAB = 1 << 22  # weights quantized at a time (16 MB of float32 temporaries)
# tensors read between handing freed heap back to the system: the float tensors read and the
# packed ones kept interleave on the heap, which grew to ~3x the packed experts without it
TRIM_EVERY = 32
Read = Callable[[str], torch.Tensor]  # our parameter name -> its tensor, read on demand


def group_size(k: int) -> int:
    """The int4 group for ``k`` inputs: 128, 64 or 32, whichever divides first."""
    g = next((g for g in GROUPS if k % g == 0), None)
    if g is None:
        raise ConfigError(f"int4 needs a linear's inputs to be a multiple of 32, got {k}")
    return g


class QLinear(nn.Module):
    """A weight-only quantized linear: ``weight`` holds the packed integers, ``scales`` their
    scales (int8: (N,) bf16; int4: (K / group, N, 2) bf16 scale and zero per group)."""

    weight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, fmt: str, packed: torch.Tensor, scales: torch.Tensor, k: int) -> None:
        super().__init__()
        self.fmt, self.in_features, self.out_features = (
            fmt,
            k,
            scales.shape[-2 if fmt == "int4" else 0],
        )
        self.group = group_size(k) if fmt == "int4" else k
        self.register_buffer("weight", packed)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        h = x.reshape(-1, shape[-1]).to(COMPUTE).contiguous()  # (M, K)
        if self.fmt == "int8":
            y = torch._weight_int8pack_mm(h, self.weight, self.scales)  # (M, N)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(h, self.weight, self.group, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)  # (..., N)


def _int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows w (n, K) -> int8 (n, K) and their scales (n,) bf16."""
    wf = w.float()
    s = (wf.abs().amax(1) / 127).clamp(min=1e-8)  # (n,)
    return torch.round(wf / s[:, None]).clamp(-128, 127).to(torch.int8), s.to(COMPUTE)


def _int4_rows(w: torch.Tensor, g: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows w (n, K) -> the kernel's packed int4 (n, K / 2) uint8 and (K / g, n, 2) bf16 scale and
    zero per group (w = (q - 8) * scale + zero, q in [0, 15])."""
    n, K = w.shape
    wg = w.float().reshape(n, K // g, g)  # (n, G, g)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)  # (n, G, 1)
    s = ((hi - lo) / 15).clamp(min=1e-8)
    q = torch.round((wg - lo) / s).clamp(0, 15).to(torch.int32).reshape(n, K)  # (n, K)
    sz = torch.cat((s, lo + 8 * s), -1).transpose(0, 1)  # (G, n, 2)
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), sz.to(COMPUTE)


def pack(w: torch.Tensor, fmt: str, bias: torch.Tensor | None = None) -> QLinear:
    """A ``QLinear`` of the float weight w (N, K) (and bias (N,)) in ``fmt``, made a slab of rows
    at a time (float temporaries of ``SLAB`` elements, beside the weight itself)."""
    if fmt not in FORMATS:
        raise ConfigError(f"weight format must be one of {FORMATS}, got {fmt!r}")
    N, K = w.shape
    if fmt == "int4" and N % 16:
        raise ConfigError(f"int4 needs a linear's outputs to be a multiple of 16, got {N}")
    rows = max(64, SLAB // K // 64 * 64)  # the int4 packing's blocks are 64 rows
    g = group_size(K) if fmt == "int4" else K
    if fmt == "int8":
        packed = torch.empty(N, K, dtype=torch.int8)
        scales = torch.empty(N, dtype=COMPUTE)
    else:
        packed = torch.empty(N, K // 2, dtype=torch.uint8)
        scales = torch.empty(K // g, N, 2, dtype=COMPUTE)
    for a in range(0, N, rows):  # written in place: no list of parts and no copy of them
        b = min(N, a + rows)
        if fmt == "int8":
            packed[a:b], scales[a:b] = _int8_rows(w[a:b])
        else:
            packed[a:b], scales[:, a:b] = _int4_rows(w[a:b], g)
    lin = QLinear(fmt, packed, scales, K)
    if bias is not None:
        lin.bias = bias.detach().to(COMPUTE)
    return lin


class QuantExpert(nn.Module):
    """One gated expert: down(act(gate(x)) * up(x)), gate and up one packed matmul."""

    def __init__(
        self, gate_up: QLinear, down: QLinear, act: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        super().__init__()
        self.gate_up, self.down, self.act = gate_up, down, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (n, F) each
        return self.down(self.act(gate) * up)  # (n, C)


class QuantExperts(nn.Module):
    """Routed quantized experts with ``StackedExperts``' call: (x (N, C), experts, weights (N, k))."""

    def __init__(self, experts: list[QuantExpert]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)

    def forward(
        self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        slots: ExpertSlots = sort_by_expert(experts, weights, len(self.experts))
        return expert_loop(x, slots, lambda e, h: self.experts[e](h)).to(x.dtype)  # (N, C)


def _expert(
    read: Read, name: str, fmt: str, act: Callable[[torch.Tensor], torch.Tensor]
) -> QuantExpert:
    """The ``ExpertMLP`` at ``name`` packed."""
    gate_up = torch.cat((read(f"{name}.gate_proj.weight"), read(f"{name}.up_proj.weight")))
    return QuantExpert(pack(gate_up, fmt), pack(read(f"{name}.down_proj.weight"), fmt), act)


def _stacked(read: Read, name: str, fmt: str, mod: StackedExperts) -> QuantExperts:
    """A ``StackedExperts`` at ``name`` packed expert by expert."""
    gate_up, down = read(f"{name}.gate_up_proj"), read(f"{name}.down_proj")  # (E, 2F, C), (E, C, F)
    out = [
        QuantExpert(pack(gate_up[e], fmt), pack(down[e], fmt), mod.act)
        for e in range(mod.n_experts)
    ]
    return QuantExperts(out)


def _linear(read: Read, name: str, fmt: str, has_bias: bool) -> QLinear:
    return pack(read(f"{name}.weight"), fmt, read(f"{name}.bias") if has_bias else None)


def _fused(read: Read, name: str, parts: tuple[str, ...], fmt: str, has_bias: bool) -> QLinear:
    """One packed linear of several same-input linears under ``name``, their rows stacked."""
    w = torch.cat([read(f"{name}.{p}.weight") for p in parts])  # (sum N, K)
    b = torch.cat([read(f"{name}.{p}.bias") for p in parts]) if has_bias else None
    return pack(w, fmt, b)


def quantize_tree(root: nn.Module, read: Read, fmt: str, prefix: str = "") -> None:
    """Swap, in place, every linear under ``root`` (its parameter names start with ``prefix``) for
    a packed one made from ``read``: routed experts, the generic transformer's attention (q, k, v
    fused) and MLP (gate and up fused), every other ``nn.Linear``; routers stay float."""
    for child_name, child in list(root.named_children()):
        name = f"{prefix}{child_name}"
        if isinstance(child, (Router, GemmaRouter)):
            continue
        if isinstance(child, ExpertMLP):
            setattr(root, child_name, _expert(read, name, fmt, child.act))
        elif isinstance(child, StackedExperts):
            setattr(root, child_name, _stacked(read, name, fmt, child))
        elif isinstance(child, Attention) and child.q_proj is not None:
            bias = child.q_proj.bias is not None
            child.qkv_quant = _fused(read, name, ("q_proj", "k_proj", "v_proj"), fmt, bias)
            o_bias = child.o_proj.bias is not None
            child.add_module("o_proj", _linear(read, f"{name}.o_proj", fmt, o_bias))
            for gone in ("q_proj", "k_proj", "v_proj"):
                setattr(child, gone, None)
        elif isinstance(child, MLP) and child.gate_proj is not None:
            child.gate_up_quant = _fused(read, name, ("gate_proj", "up_proj"), fmt, False)
            child.add_module("down_proj", _linear(read, f"{name}.down_proj", fmt, False))
            for gone in ("gate_proj", "up_proj"):
                setattr(child, gone, None)
        elif isinstance(child, nn.Linear):
            setattr(root, child_name, _linear(read, name, fmt, child.bias is not None))
        else:
            quantize_tree(child, read, fmt, f"{name}.")


def load_quantized(
    net: nn.Module, state: Mapping[str, torch.Tensor], fmt: str, aliases: Mapping[str, str]
) -> nn.Module:
    """``net`` (built on the meta device) with its linears packed in ``fmt`` and every other tensor
    set in bf16 (integers as they are), each read from ``state`` when needed (``aliases``: names a
    tied weight is read under, e.g. the head from the embeddings)."""

    done = [0]

    def read(name: str) -> torch.Tensor:
        done[0] += 1
        if done[0] % TRIM_EVERY == 0:
            release_freed_memory()
        return state[aliases.get(name, name)]

    quantize_tree(net, read, fmt)
    rest = {
        n: t
        for n, t in (*net.named_parameters(), *net.named_buffers())
        if t.is_meta and aliases.get(n, n) in state
    }
    for n in rest:
        t = read(n)
        module_name, _, attr = n.rpartition(".")
        owner = net.get_submodule(module_name)
        value = t.to(COMPUTE) if t.is_floating_point() else t
        if attr in owner._parameters:
            owner._parameters[attr] = nn.Parameter(value, requires_grad=False)
        else:
            owner._buffers[attr] = value
    release_freed_memory()
    return net.eval()
