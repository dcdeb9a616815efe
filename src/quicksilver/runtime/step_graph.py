"""The decoder step as a static-shape graph for CPU runtimes (ONNX Runtime, OpenVINO).

``StepGraph`` wraps a ``Transformer`` into one pure function of fixed-shape tensors, the form an
exporter can trace: the T new tokens, their absolute positions, an additive attention mask over
``[cache buffer (C) | new tokens (T)]`` and one key and one value buffer per layer, the whole
``KVCache`` buffer of capacity C (unused slots masked). It returns the raw (unshifted) logits of the
T tokens and the T new keys/values of every layer stacked in the cache's own layout (keys, then
values), so the caller writes them into the cache in one copy. Per-layer
buffers as separate inputs, not one combined cache sliced inside the graph (the issue measured the
latter 2-3x slower). Only inference-time features of the network are covered (no QK-norm, no qkv
clipping, no MoE): ``check_supported`` says why a model is not.
"""

from __future__ import annotations

import math
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import ConfigError
from ..models.transformer import RMSNorm, Transformer, apply_rotary


def _rms(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm spelled in elementary ops (the exporter has no ``aten::rms_norm``)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight  # (1, T, C)


def check_supported(model: Transformer, quantized: str = "none") -> None:
    """Raise ConfigError when the step graph cannot express this network (its linears in the
    ``quantized`` format) exactly."""
    cfg = model.config
    if quantized != "none":
        raise ConfigError(f"the exported CPU step does not support {quantized}; use torch")
    why = [
        name
        for name, bad in (
            ("qk_norm", cfg.qk_norm),
            ("clip_qkv", cfg.clip_qkv is not None),
            ("moe", cfg.moe is not None),
            ("a non-float32 dtype", model.lm_head.weight.dtype != torch.float32),
            ("a non-CPU device", model.lm_head.weight.device.type != "cpu"),
        )
        if bad
    ]
    if why:
        raise ConfigError(f"the exported CPU step does not support {', '.join(why)}; use torch")


class StepGraph(nn.Module):
    """ids (1, T), pos (1, T), mask (1, 1, T, C+T), past k/v per layer (1, Hkv, C, hd) ->
    logits (1, T, V), new keys then values of every layer (2 * layers, 1, Hkv, T, hd)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        check_supported(model)
        self.m = model
        cfg = model.config
        self.H, self.Hkv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.dim_head
        model.rotary._build(cfg.max_seq_len)
        self.cos = model.rotary.cos_table  # (max_len, rd)
        self.sin = model.rotary.sin_table

    def forward(self, ids, pos, mask, *past):  # type: ignore[no-untyped-def]
        n = len(self.m.model.layers)
        H, Hkv, hd = self.H, self.Hkv, self.hd
        T = ids.shape[1]
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # (1, 1, T, rd)
        x = self.m.model.embed_tokens(ids)  # (1, T, C)
        new_k, new_v = [], []
        for i, layer in enumerate(self.m.model.layers):
            att = layer.self_attn
            w = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])
            b = None
            if att.q_proj.bias is not None:
                b = torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias])
            qkv = F.linear(_rms(layer.input_layernorm, x), w, b).view(1, T, H + 2 * Hkv, hd)
            qk = apply_rotary(qkv[:, :, : H + Hkv].transpose(1, 2), cos, sin)  # (1, H+Hkv, T, hd)
            q, k = qk[:, :H], qk[:, H:]  # (1, H, T, hd), (1, Hkv, T, hd)
            v = qkv[:, :, H + Hkv :].transpose(1, 2)  # (1, Hkv, T, hd)
            new_k.append(k)
            new_v.append(v)
            pk, pv = past[i], past[n + i]  # (1, Hkv, C, hd)
            if Hkv != H:
                pk, pv, k, v = (t.repeat_interleave(H // Hkv, dim=1) for t in (pk, pv, k, v))
            # scores against the cache buffer and the new keys apart: no copy of the cache
            s = torch.cat((q @ pk.transpose(-1, -2), q @ k.transpose(-1, -2)), dim=-1)
            p = (s * (1.0 / math.sqrt(hd)) + mask).softmax(-1)  # (1, H, T, C+T)
            C = pk.shape[2]
            y = p[..., :C] @ pv + p[..., C:] @ v  # (1, H, T, hd)
            y = y.transpose(1, 2).reshape(1, T, H * hd)  # (1, T, H*hd)
            x = x + att.o_proj(y)  # (1, T, C)
            x = x + layer.mlp(_rms(layer.post_attention_layernorm, x))
        logits = self.m.lm_head(_rms(self.m.model.norm, x))  # (1, T, V)
        return logits, torch.stack(new_k + new_v)  # (1, T, V), (2n, 1, Hkv, T, hd)


def export_onnx(model: Transformer, directory: Path) -> Path:
    """Write the step graph as ONNX with dynamic T and C (the runtimes fix them per bucket)."""
    cfg = model.config
    n, Hkv, hd = cfg.n_layers, cfg.n_kv_heads, cfg.dim_head
    T, C = 2, 64
    ids = torch.zeros((1, T), dtype=torch.long)
    pos = torch.arange(T)[None]
    mask = torch.zeros((1, 1, T, C + T))
    past = [torch.zeros((1, Hkv, C, hd)) for _ in range(2 * n)]
    names = [f"past_k{i}" for i in range(n)] + [f"past_v{i}" for i in range(n)]
    outs = ["logits", "new_kv"]
    dyn = {"ids": {1: "T"}, "pos": {1: "T"}, "mask": {2: "T", 3: "CT"}}
    dyn |= {nm: {2: "C"} for nm in names} | {"logits": {1: "T"}, "new_kv": {3: "T"}}
    path = directory / "step.onnx"
    graph = StepGraph(model).eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes about shape-dependent Python branches
        torch.onnx.export(
            graph,
            (ids, pos, mask, *past),
            str(path),
            input_names=["ids", "pos", "mask", *names],
            output_names=outs,
            dynamic_axes=dyn,
            opset_version=17,
            dynamo=False,
        )
    return path


def export_to_temp(model: Transformer) -> tuple[tempfile.TemporaryDirectory[str], Path]:
    """Export into a fresh temporary directory (kept alive by the returned handle)."""
    tmp = tempfile.TemporaryDirectory(prefix="qs-step-")
    return tmp, export_onnx(model, Path(tmp.name))
