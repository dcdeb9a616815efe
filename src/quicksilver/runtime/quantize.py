"""Quantized weights on the CPU: ``--quantize int8|int4`` (on FP8 GPUs ``fp8``: runtime/fp8.py).

Dense networks run through their step graph with weight-only int8 (one scale per output channel) or
int4 (one scale per group of 128 inputs) weights on OpenVINO's CPU kernels (runtime/ov_graph.py):
every linear layer and the head, the embedding table int8 per row; measured against llama.cpp's
Q8_0 / Q4_0 in ``bench shapes --vs-llama-cpp`` (docs/LOG.md). Mixture-of-experts networks, which
that graph does not express yet, keep PyTorch's dynamic int8 (``torch.ao`` ``quantize_dynamic``,
fbgemm / x86 kernels, activations quantized per call) of every linear but the experts (batched
parameter tensors, not linears): int8 only. A quantized model is for inference only, on the CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from torch import nn

from ..errors import ConfigError
from ..models.checkpoint import check_state
from ..models.config import ModelConfig
from ..models.transformer import MLP, Attention, Transformer
from .cpu_backends import installed, native_bf16
from .fp8 import fp8_unsupported, to_fp8
from .ov_graph import attach_graph
from .runtime import Runtime

QUANTIZE_CHOICES = ("none", "int8", "int4", "fp8")  # fp8: GPUs only (runtime/fp8.py)
# what --backend may say beside --quantize on a dense network: its step is the quantized graph on
# OpenVINO whichever of these is asked (torch is load's default, not a request for eager torch)
GRAPH_BACKENDS = ("auto", "torch", "openvino")


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


def check_mode(mode: str, device: torch.device, backend: str, moe: bool) -> None:
    """A one-line ConfigError for a quantization this runtime cannot give (see ``quantize``)."""
    if mode not in QUANTIZE_CHOICES:
        raise ConfigError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {mode!r}")
    if mode == "none":
        return
    if mode == "fp8":
        why = fp8_unsupported(device)
        if why is not None or moe:
            raise ConfigError(why or "--quantize fp8 is for dense networks (MoE experts: bf16)")
        return
    if device.type != "cpu":
        raise ConfigError(f"--quantize {mode} runs on the CPU only (the model is on {device})")
    if moe and mode != "int8":
        raise ConfigError("mixture-of-experts networks quantize to int8 only (torch.ao)")
    if not moe and backend not in GRAPH_BACKENDS:
        raise ConfigError(
            f"--quantize {mode} runs on OpenVINO's weight-compressed kernels: "
            f"use --backend {' or '.join(GRAPH_BACKENDS)}, not {backend!r}"
        )


def quantized_runtime(
    cfg: ModelConfig, state: Mapping[str, torch.Tensor], fmt: str, backend: str = "auto"
) -> Runtime:
    """A dense network's runtime straight from its checkpoint's tensors in graph weight format
    ``fmt``, each tensor read, compressed and let go in turn (the network stays on the meta device:
    no float copy of the weights, peak memory near the compressed weights)."""
    if fmt in QUANTIZE_CHOICES:
        check_mode(fmt, torch.device("cpu"), backend, cfg.moe is not None)
    state = check_state(cfg, state)
    with torch.device("meta"):
        runtime = Runtime(Transformer(cfg))
    attach_graph(runtime, fmt, weights=state.__getitem__)
    return runtime


def graph_format(
    quantize: str, backend: str, dtype: torch.dtype, device: torch.device, moe: bool
) -> str | None:
    """The weight format a dense CPU network's step graph is built in straight from its files, or
    None for a network built in torch: ``--quantize int8|int4``, or bf16 weights under ``--backend
    auto`` on a CPU without bf16 arithmetic, where torch would emulate it and OpenVINO's kernels
    widen the weights inside the matmuls. Where the CPU has bf16 (AMX, AVX-512 BF16) torch runs it
    natively and keeps the lower peak: compiling the graph holds its constants and the plugin's
    repacked copy at once (the 1.5B body in bf16 peaked at 10.0 GB against torch's 6.5)."""
    if moe or device.type != "cpu":
        return None
    if quantize != "none":
        return quantize
    if (
        backend == "auto"
        and dtype == torch.bfloat16
        and installed("openvino")
        and not native_bf16()
    ):
        return "bf16"
    return None


def quantize(runtime: Runtime, mode: str, backend: str = "auto") -> Runtime:
    """Quantize the runtime's weights (``mode``: none | int8 | int4; ``backend``: what was asked
    for the step, which a quantized dense network must leave to OpenVINO) and return it."""
    check_mode(mode, runtime.device, backend, runtime.config.moe is not None)
    if mode == "none":
        return runtime
    if mode == "fp8":
        to_fp8(runtime.net)
        runtime.quantized = "fp8"
        return runtime
    if runtime.config.moe is not None:
        return quantize_dynamic_int8(runtime)
    attach_graph(runtime, mode)
    return runtime


def quantize_dynamic_int8(runtime: Runtime) -> Runtime:
    """torch.ao's dynamic int8 of the network's linears (MoE networks; see the module docstring)."""
    model = runtime.net
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
    runtime.quantized = "int8"
    return runtime
