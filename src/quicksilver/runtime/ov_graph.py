"""The decoder step built directly as an OpenVINO graph, its weights stored int8, int4, bf16 or float32.

This is the CPU runtime for real sizes (``--quantize int8|int4``). The step has the exported step's
signature (runtime/step_graph.py): ids (1, T), pos (1, T), an additive mask (1, 1, T, C+T) and one
key and one value buffer per layer (1, Hkv, C, hd) in, the raw logits (1, T, V) and the T new keys
then values of every layer stacked (2n, 1, Hkv, T, hd) out, so ``ExportedStep`` serves it unchanged.
T and C are dynamic: one compiled model serves every shape, its weights held once.

Why a graph of our own rather than the traced torch step: tracing needs the whole network in
float32 first (6 GB at 1.5B parameters, 64 GB for a 16B MoE), and the tracer cannot store
compressed weights. Here each weight goes from the checkpoint into its constant on its own
(``Weights`` is read one tensor at a time), quantized on the way: weight-only, symmetric, one scale
per output channel (int8) or per group of ``group`` inputs (int4), in the layout of NNCF's weight
compression (integer constant -> Convert -> Multiply by the scales), which OpenVINO's CPU plugin
fuses into its matmul kernels (AMX / AVX-512 VNNI / AVX2, activations quantized to int8 on the fly):
the well-kept kernels, our code only says what the network is. The embedding table is int8 per row
in every quantized format (only T rows of it are read a step); a tied head is its own constant in
the linears' format. Covered: RMSNorm, GQA, q/k/v and o biases, QK-norm, qkv clipping, partial
rotary and every attention pattern (the mask is an input); mixture-of-experts MLPs are not (a
``ConfigError`` says so: ``check_graph``).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..models.config import ModelConfig
from .cpu_backends import ExportedStep, installed, native_bf16, step_buckets
from .runtime import Runtime

GRAPH_FORMATS = ("float32", "bf16", "int8", "int4")
# the step backend's name per weight format (``openvino-bf16`` is the traced float32 step computed
# in bf16, runtime/cpu_backends.py: another thing)
GRAPH_NAMES = {
    "float32": "openvino-f32-weights",
    "bf16": "openvino-bf16-weights",
    "int8": "openvino-int8",
    "int4": "openvino-int4",
}
GROUPS = (128, 64, 32)  # int4 group sizes, the largest that divides a linear's inputs
# activations quantized to int8 in groups of this many inputs inside the integer matmuls: at the
# 1.5B shape in int4 (one thread, Sapphire Rapids) the 8-position step / AR token went from 1.52
# (OpenVINO's default, 32) to 1.36 at 64 for a 3% slower AR token; 128 gave 1.22 with a 15% slower
# AR token, 256 was 4x slower (docs/LOG.md, 2026-12-07)
DQ_GROUP = 64
QUANT_SLAB = 1 << 22  # weights quantized at a time (16 MB of float32 temporaries)
Weights = Callable[[str], torch.Tensor]  # our parameter name -> its tensor, read on demand
Node = Any  # an OpenVINO node output (openvino has no type stubs)


def _ops() -> Any:
    import openvino.opset13 as ops  # lazy: openvino is the optional [cpu] extra

    return ops


def group_size(k: int) -> int:
    """The int4 group for a linear of ``k`` inputs: 128, 64 or 32 where one divides it, else its
    largest divisor up to 128 (the real shapes' widths are multiples of 128)."""
    return next((g for g in GROUPS if k % g == 0), None) or max(
        d for d in range(1, min(k, 128) + 1) if k % d == 0
    )


def quantize_groups(w: torch.Tensor, bits: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric weight-only quantization of w (N, K) in groups of ``group`` inputs: integers
    (N, K / group, group) int8 in [-2^(bits-1), 2^(bits-1) - 1] and scales (N, K / group, 1) f16.
    Done a slab of rows at a time, so that the float temporaries stay small beside the weights."""
    N, K = w.shape
    qmax = 2 ** (bits - 1) - 1
    q = np.empty((N, K // group, group), dtype=np.int8)
    scale = np.empty((N, K // group, 1), dtype=np.float16)
    rows = max(1, QUANT_SLAB // K)
    for a in range(0, N, rows):
        wg = w[a : a + rows].float().reshape(-1, K // group, group)  # (n, G, g)
        s = (wg.abs().amax(-1, keepdim=True) / qmax).clamp(min=1e-8).half()  # (n, G, 1)
        q[a : a + rows] = torch.round(wg / s.float()).clamp(-qmax - 1, qmax).to(torch.int8).numpy()
        scale[a : a + rows] = s.numpy()
    return q, scale


def _packed_i4(q: np.ndarray) -> Any:
    """An OpenVINO i4 constant of q (int8 values in [-8, 7]): two a byte, the first in the low nibble."""
    import openvino as ov  # lazy: the optional [cpu] extra

    u = (q.astype(np.uint8) & 0xF).reshape(-1)
    packed = u[0::2] | (u[1::2] << 4)  # (numel / 2,) uint8
    return ov.op.Constant(
        ov.Tensor(packed, ov.Shape(list(q.shape)), ov.Type.i4), shared_memory=False
    )


def _bf16(w: torch.Tensor) -> Any:
    import openvino as ov  # lazy: the optional [cpu] extra

    raw = w.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    return ov.op.Constant(
        ov.Tensor(raw, ov.Shape(list(w.shape)), ov.Type.bf16), shared_memory=False
    )


def weight(w: torch.Tensor, fmt: str, per_row: bool = False) -> Node:
    """w (N, K) as a float32 graph value in format ``fmt`` (``per_row``: int8 per output row, the
    embedding's layout, whatever the format)."""
    ops = _ops()
    if fmt == "float32":
        return ops.constant(w.float().contiguous().numpy())
    if fmt == "bf16":
        return ops.convert(_bf16(w), np.float32)
    N, K = w.shape
    bits = 8 if per_row or fmt == "int8" else 4
    g = K if bits == 8 else group_size(K)
    q, scale = quantize_groups(w, bits, g)
    const = ops.constant(q) if bits == 8 else _packed_i4(q)
    deq = ops.multiply(ops.convert(const, np.float16), ops.constant(scale))  # (N, G, g) f16
    return ops.convert(ops.reshape(deq, [N, K], False), np.float32)  # (N, K)


class GraphBuilder:
    """Builds the step graph of one network from its weights (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, weights: Weights, fmt: str) -> None:
        if fmt not in GRAPH_FORMATS:
            raise ConfigError(f"graph weight format must be one of {GRAPH_FORMATS}, got {fmt!r}")
        self.cfg, self.w, self.fmt = cfg, weights, fmt
        self.ops = _ops()

    def linear(self, x: Node, name: str, bias: bool = False) -> Node:
        """x (..., K) @ W.T (+ b) for the linear ``name`` (our parameter prefix)."""
        ops = self.ops
        y = ops.matmul(x, weight(self.w(name + ".weight"), self.fmt), False, True)
        if bias:
            y = ops.add(y, ops.constant(self.w(name + ".bias").float().numpy()))
        return y

    def fused(self, x: Node, names: list[str], bias: bool) -> Node:
        """One matmul for several linears of the same input (q/k/v, gate/up): their rows stacked."""
        ops = self.ops
        w = torch.cat([self.w(n + ".weight") for n in names])  # (sum N, K)
        y = ops.matmul(x, weight(w, self.fmt), False, True)
        if bias:
            b = torch.cat([self.w(n + ".bias").float() for n in names])
            y = ops.add(y, ops.constant(b.numpy()))
        return y

    def rms(self, x: Node, name: str) -> Node:
        """RMSNorm over the last axis with the weight ``name``."""
        ops, eps = self.ops, np.float32(self.cfg.norm_eps)
        ms = ops.reduce_mean(ops.multiply(x, x), np.array([-1]), True)
        inv = ops.divide(np.float32(1.0), ops.sqrt(ops.add(ms, eps)))
        return ops.multiply(ops.multiply(x, inv), self.w(name).float().numpy())

    def rope_tables(self, pos: Node) -> tuple[Node, Node]:
        """cos and sin (1, 1, T, rd) of the positions (1, T)."""
        cfg, ops = self.cfg, self.ops
        rd = cfg.rotary_dim
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
        f = torch.arange(cfg.max_seq_len, dtype=torch.float32)[:, None] * inv  # (L, rd/2)
        emb = torch.cat((f, f), dim=-1)  # (L, rd)
        cos = ops.gather(ops.constant(emb.cos().numpy()), pos, np.int64(0))  # (1, T, rd)
        sin = ops.gather(ops.constant(emb.sin().numpy()), pos, np.int64(0))
        return ops.unsqueeze(cos, np.int64(1)), ops.unsqueeze(sin, np.int64(1))

    def rotate(self, x: Node, cos: Node, sin: Node) -> Node:
        """Half-split rotary on the leading rd dims of x (1, h, T, hd)."""
        ops, hd, rd = self.ops, self.cfg.dim_head, self.cfg.rotary_dim
        if rd < hd:  # partial rotary: rotate the leading rd dims, pass the rest through
            parts = ops.variadic_split(x, np.int64(-1), np.array([rd, hd - rd]))
            return ops.concat([self.rotate_all(parts.output(0), cos, sin), parts.output(1)], -1)
        return self.rotate_all(x, cos, sin)

    def rotate_all(self, x: Node, cos: Node, sin: Node) -> Node:
        """x * cos + rotate_half(x) * sin over the whole last axis of x (1, h, T, rd)."""
        ops = self.ops
        halves = ops.split(x, np.int64(-1), 2)
        rot = ops.concat([ops.negative(halves.output(1)), halves.output(0)], -1)  # (1, h, T, rd)
        return ops.add(ops.multiply(x, cos), ops.multiply(rot, sin))

    def attention(
        self, h: Node, i: int, cos: Node, sin: Node, mask: Node, pk: Node, pv: Node
    ) -> tuple[Node, Node, Node]:
        """Layer i's attention of h (1, T, C) over the cache (pk, pv) and itself: the output
        (1, T, C) and the new keys and values (1, Hkv, T, hd)."""
        cfg, ops = self.cfg, self.ops
        H, Hkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.dim_head
        p = f"model.layers.{i}.self_attn"
        qkv = self.fused(h, [f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"], cfg.qkv_bias)
        qkv = ops.transpose(ops.reshape(qkv, [1, -1, H + 2 * Hkv, hd], False), [0, 2, 1, 3])
        parts = ops.variadic_split(qkv, np.int64(1), np.array([H, Hkv, Hkv]))  # (1, h, T, hd)
        q, k, v = parts.output(0), parts.output(1), parts.output(2)
        if cfg.qk_norm:
            q, k = self.rms(q, f"{p}.q_norm.weight"), self.rms(k, f"{p}.k_norm.weight")
        if cfg.clip_qkv is not None:
            c = float(cfg.clip_qkv)
            q, k, v = (ops.clamp(t, -c, c) for t in (q, k, v))
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        keys = ops.unsqueeze(ops.concat([pk, k], 2), np.int64(2))  # (1, Hkv, 1, C+T, hd)
        vals = ops.unsqueeze(ops.concat([pv, v], 2), np.int64(2))
        q5 = ops.reshape(q, [1, Hkv, H // Hkv, -1, hd], False)  # (1, Hkv, G, T, hd)
        s = ops.matmul(q5, keys, False, True)  # (1, Hkv, G, T, C+T)
        s = ops.add(ops.multiply(s, np.float32(1.0 / math.sqrt(hd))), mask)
        y = ops.matmul(ops.softmax(s, -1), vals, False, False)  # (1, Hkv, G, T, hd)
        y = ops.reshape(
            ops.transpose(ops.reshape(y, [1, H, -1, hd], False), [0, 2, 1, 3]),
            [1, -1, H * hd],
            False,
        )
        return self.linear(y, f"{p}.o_proj", cfg.o_bias), k, v

    def mlp(self, h: Node, i: int) -> Node:
        """Layer i's SwiGLU MLP (or mixture of experts) of h (1, T, C)."""
        ops, p = self.ops, f"model.layers.{i}.mlp"
        gu = ops.split(self.fused(h, [f"{p}.gate_proj", f"{p}.up_proj"], False), np.int64(-1), 2)
        return self.linear(ops.multiply(ops.swish(gu.output(0)), gu.output(1)), f"{p}.down_proj")

    def build(self) -> Any:
        """The step as an ``openvino.Model`` (see the module docstring)."""
        import openvino as ov  # lazy: the optional [cpu] extra

        cfg, ops = self.cfg, self.ops
        n, Hkv, hd = cfg.n_layers, cfg.n_kv_heads, cfg.dim_head
        ids = ops.parameter([1, -1], np.int64, name="ids")
        pos = ops.parameter([1, -1], np.int64, name="pos")
        mask = ops.parameter([1, 1, -1, -1], np.float32, name="mask")
        past = [
            ops.parameter([1, Hkv, -1, hd], np.float32, name=f"past_{kv}{i}")
            for kv in "kv"
            for i in range(n)
        ]
        emb_w = self.w("model.embed_tokens.weight")
        table = weight(emb_w, self.fmt, per_row=self.fmt in ("int8", "int4"))
        x = ops.gather(table, ids, np.int64(0))  # (1, T, C)
        release_freed_memory()
        cos, sin = self.rope_tables(pos)
        mask5 = ops.unsqueeze(mask, np.int64(1))  # (1, 1, 1, T, C+T)
        new_k, new_v = [], []
        for i in range(n):
            h = self.rms(x, f"model.layers.{i}.input_layernorm.weight")
            a, k, v = self.attention(h, i, cos, sin, mask5, past[i], past[n + i])
            x = ops.add(x, a)
            x = ops.add(
                x, self.mlp(self.rms(x, f"model.layers.{i}.post_attention_layernorm.weight"), i)
            )
            new_k.append(ops.unsqueeze(k, np.int64(0)))
            new_v.append(ops.unsqueeze(v, np.int64(0)))
            release_freed_memory()  # a layer's float temporaries, before the next layer's
        del emb_w  # the head's own copy follows (tied: read again)
        head = self.w("model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight")
        logits = ops.matmul(self.rms(x, "model.norm.weight"), weight(head, self.fmt), False, True)
        del head
        release_freed_memory()
        logits.output(0).get_tensor().set_names({"logits"})
        kv = ops.concat(new_k + new_v, 0)  # (2n, 1, Hkv, T, hd)
        kv.output(0).get_tensor().set_names({"new_kv"})
        return ov.Model([logits, kv], [ids, pos, mask, *past], "quicksilver_step")


def check_graph(cfg: ModelConfig) -> None:
    """Raise ConfigError when the graph cannot express this network."""
    if cfg.moe is not None:
        raise ConfigError(
            "--quantize int8|int4 runs dense networks; mixture-of-experts ones run in torch"
        )


def build_step(cfg: ModelConfig, weights: Weights, fmt: str) -> Any:
    """The step graph of a network of config ``cfg`` whose tensors ``weights`` reads, in ``fmt``."""
    check_graph(cfg)
    return GraphBuilder(cfg, weights, fmt).build()


def state_weights(net: torch.nn.Module) -> Weights:
    """``Weights`` of a loaded torch network (its state dict, by name)."""
    state = net.state_dict()
    return lambda name: state[name].detach()


class GraphRunner:
    """One compiled model of the step for every shape (its weights held once); an infer request
    per slot, its tensors sharing the slot's memory. Computes in float32 with the weights' integer
    formats decompressed inside the matmuls (activations quantized on the fly), or in bf16 for
    bf16 weights where the CPU has it."""

    def __init__(self, model: Any, threads: int, precision: str) -> None:
        import openvino as ov  # lazy: the optional [cpu] extra

        self.ov = ov
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": precision,
            "PERFORMANCE_HINT": "LATENCY",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": DQ_GROUP,
        }
        self.model = ov.Core().compile_model(model, "CPU", config)

    def bind(self, inputs: dict[str, np.ndarray], outs: list[np.ndarray]) -> Callable[[], None]:
        req = self.model.create_infer_request()
        for name, a in inputs.items():
            req.set_tensor(name, self.ov.Tensor(a, shared_memory=True))
        for i, a in enumerate(outs):
            req.set_output_tensor(i, self.ov.Tensor(a, shared_memory=True))
        return lambda: req.infer()


def release_freed_memory() -> None:
    """Hand the memory freed while building back to the system (glibc keeps freed heap pages of
    many mid-sized allocations: 1.5B parameters in int4 held 4.8 GB after building, 1.5 GB after
    this; elsewhere a no-op)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def graph_buckets(draft: int) -> tuple[int, ...]:
    """Token counts a graph pass is padded to: every count to 17 exactly (the AR token, windows of
    4 / 8 / 16, verify passes of 1 + k and 1 + 2k), then the exported step's buckets. One compiled
    model serves them all; each is a slot's buffers, made on first use."""
    return tuple(sorted(set(step_buckets(draft)) | set(range(1, 18))))


def graph_step(cfg: ModelConfig, weights: Weights, fmt: str, threads: int) -> ExportedStep:
    """The step of the network ``weights`` reads, in weight format ``fmt``, as a step backend that
    serves every pass (no torch weights are needed behind it)."""
    model = build_step(cfg, weights, fmt)
    precision = "bf16" if fmt == "bf16" and native_bf16() else "f32"
    runner = GraphRunner(model, threads, precision)
    del model  # the compiled model holds the weights in its own layout
    release_freed_memory()
    buckets = graph_buckets(cfg.draft_length)
    return ExportedStep(cfg, runner, GRAPH_NAMES[fmt], buckets=buckets, whole=True)


def attach_graph(
    runtime: Runtime, fmt: str, threads: int | None = None, weights: Weights | None = None
) -> str:
    """Serve every pass of ``runtime`` through its network's graph in weight format ``fmt``, the
    weights read from ``weights`` (default: the network's own; a checkpoint read lazily leaves
    the network on the meta device); the name of the step backend."""
    if not installed("openvino"):
        raise ConfigError(f"--quantize {fmt} needs OpenVINO: pip install 'quicksilver[cpu]'")
    source = weights or state_weights(runtime.net)
    step = graph_step(runtime.config, source, fmt, threads or torch.get_num_threads())
    runtime.attach(step)
    runtime.quantized = fmt
    runtime.device = torch.device("cpu")
    return step.name
