"""Quantized weights on the CPU: ``--quantize int8|int4`` (on FP8 GPUs ``fp8``: runtime/fp8.py).

Dense networks run through their step graph with weight-only int8 (one scale per output channel) or
int4 (one scale per group of 128 inputs) weights on OpenVINO's CPU kernels (runtime/ov_graph.py):
every linear layer and the head, the embedding table int8 per row; measured against llama.cpp's
Q8_0 / Q4_0 in ``bench shapes --vs-llama-cpp`` (docs/LOG.md). Mixture-of-experts networks, which
that graph does not express, run in torch with weight-only int8 / int4 linears on torch's CPU
kernels (runtime/weight_only.py): the routed experts (one call per active expert), attention, dense
and shared MLPs and the head, activations in bf16, routers and norms in float; built straight from
the checkpoint's tensors, one at a time (``quantized_runtime``). A quantized model is for inference
only, on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import ConfigError
from ..models.checkpoint import NETWORK_READERS, Network, State, architecture, check_state
from ..models.config import ModelConfig
from ..models.meta import meta_build
from ..models.transformer import Rotary, Transformer
from .cpu_backends import installed, native_bf16
from .fp8 import fp8_unsupported, to_fp8
from .ov_graph import attach_graph
from .runtime import Runtime
from .weight_only import COMPUTE, load_quantized, quantize_tree

QUANTIZE_CHOICES = ("none", "int8", "int4", "fp8")  # fp8: GPUs only (runtime/fp8.py)
# what --backend may say beside --quantize on a dense network: its step is the quantized graph on
# OpenVINO whichever of these is asked (torch is load's default, not a request for eager torch)
GRAPH_BACKENDS = ("auto", "torch", "openvino")


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
    if moe and backend not in ("auto", "torch"):
        raise ConfigError(
            f"--quantize {mode} of a mixture-of-experts network runs in torch: use --backend "
            f"auto or torch, not {backend!r}"
        )
    if not moe and backend not in GRAPH_BACKENDS:
        raise ConfigError(
            f"--quantize {mode} runs on OpenVINO's weight-compressed kernels: "
            f"use --backend {' or '.join(GRAPH_BACKENDS)}, not {backend!r}"
        )


def quantized_runtime(
    cfg: ModelConfig, state: Mapping[str, torch.Tensor], fmt: str, backend: str = "auto"
) -> Runtime:
    """A network's runtime straight from its checkpoint's tensors in weight format ``fmt``, each
    tensor read, compressed and let go in turn (the network is built on the meta device: no float
    copy of the weights, peak memory near the compressed weights): a dense network's step graph, a
    mixture of experts' torch network with weight-only linears (see the module docstring)."""
    moe = cfg.moe is not None
    if fmt in QUANTIZE_CHOICES:
        check_mode(fmt, torch.device("cpu"), backend, moe)
    state = check_state(cfg, state)
    if not moe:
        with meta_build():
            runtime = Runtime(Transformer(cfg))
        attach_graph(runtime, fmt, weights=state.__getitem__)
        return runtime
    return moe_runtime(cfg, state, fmt)


def moe_runtime(cfg: ModelConfig, state: Mapping[str, torch.Tensor], fmt: str) -> Runtime:
    """A mixture of experts' torch network from ``state`` (names and shapes already checked) with
    weight-only ``fmt`` linears, each tensor read, packed and let go in turn."""
    with meta_build():
        net = Transformer(cfg)
    tied = {"lm_head.weight": "model.embed_tokens.weight"} if cfg.tie_embeddings else {}
    load_quantized(net, state, fmt, tied)
    net.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta, cfg.max_seq_len)
    runtime = Runtime(net)
    runtime.quantized = fmt
    return runtime


def graph_format(
    quantize: str, backend: str, dtype: torch.dtype, device: torch.device, moe: bool
) -> str | None:
    """The weight format a CPU network is built in straight from its files (``quantized_runtime``),
    or None for a float network built in torch: ``--quantize int8|int4``, or for a dense one bf16 weights under ``--backend
    auto`` on a CPU without bf16 arithmetic, where torch would emulate it and OpenVINO's kernels
    widen the weights inside the matmuls. Where the CPU has bf16 (AMX, AVX-512 BF16) torch runs it
    natively and keeps the lower peak: compiling the graph holds its constants and the plugin's
    repacked copy at once (the 1.5B body in bf16 peaked at 10.0 GB against torch's 6.5)."""
    if device.type != "cpu":
        return None
    if quantize != "none":
        return quantize
    if (
        not moe
        and backend == "auto"
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
    if runtime.config.moe is None:
        attach_graph(runtime, mode)
        return runtime
    net = runtime.net
    state = net.state_dict()
    quantize_tree(net, state.__getitem__, mode)
    for p in net.parameters():  # what is left in float: embeddings, norms, routers
        p.data = p.data.to(COMPUTE)
    runtime.quantized = mode
    return runtime


def quantized_network(path: Path, fmt: str) -> Network:
    """A network of a family's own (DiffusionGemma) straight from its checkpoint's tensors with
    weight-only ``fmt`` linears and experts, each tensor read, packed and let go in turn."""
    check_mode(fmt, torch.device("cpu"), "torch", True)
    arch = architecture(path)
    if arch not in NETWORK_READERS:
        raise ConfigError(f"{arch} has no quantized load")

    def fill(net: torch.nn.Module, state: State) -> None:
        load_quantized(net, state, fmt, {})

    return NETWORK_READERS[arch](path, fill, torch.device("cpu"))
