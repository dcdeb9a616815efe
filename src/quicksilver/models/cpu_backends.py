"""CPU step backends: the exported step graph (models/step_graph.py) run by ONNX Runtime or OpenVINO.

A backend serves the single-segment passes of ``DiffusionLM.forward_segments`` — the AR token
step, the diffusion block step and window step of one sequence — when their new tokens fit the
largest token bucket; anything else (packed batches, no cache) returns None and the eager torch
path runs it. Shapes are static per bucket: the new tokens are padded to a bucket of
``TOKEN_BUCKETS`` and the cache is fed whole (its capacity is a power of two, see ``KVCache``),
unused slots masked. The caller (here) writes the returned keys/values into the ``KVCache``, so
torch and the backend share one cache and can take turns.

Chosen once by name from ``BACKENDS``; ``auto`` is the measured winner on a CPU (docs/LOG.md,
2026-12-01) and torch elsewhere. Checked equal to eager torch in tests/test_backend.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from .kvcache import KVCache
from .step_graph import check_supported, export_to_temp
from .transformer import DiffusionLM, Segment

# new tokens per pass: the AR step, windows (w, or w + 1 with the predictor on the left), a block,
# two blocks (a finished one appended with the next), prefills (padded: compute-bound anyway)
TOKEN_BUCKETS = (1, 8, 9, 16, 17, 32, 64, 128, 256, 384)
NEG = np.float32(-np.inf)
Feeds = dict[str, np.ndarray]


class OrtRunner:
    """ONNX Runtime on the CPU, one session for every shape."""

    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, feeds: Feeds) -> list[np.ndarray]:
        return self.session.run(self.outputs, feeds)


class OvRunner:
    """OpenVINO on the CPU at f32, one compiled model per (tokens, cache capacity) bucket."""

    def __init__(self, path: str, threads: int) -> None:
        import openvino as ov

        self.core = ov.Core()
        self.core.set_property(
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": "f32",  # no silent bf16 on CPUs that have it
                "PERFORMANCE_HINT": "LATENCY",
            },
        )
        self.path = path
        self.requests: dict[tuple[int, ...], Any] = {}

    def _request(self, feeds: Feeds) -> Any:
        key = tuple(feeds["mask"].shape) + tuple(feeds["past_k0"].shape)
        req = self.requests.get(key)
        if req is None:
            model = self.core.read_model(self.path)
            model.reshape({name: list(a.shape) for name, a in feeds.items()})
            req = self.core.compile_model(model, "CPU").create_infer_request()
            self.requests[key] = req
        return req

    def __call__(self, feeds: Feeds) -> list[np.ndarray]:
        req = self._request(feeds)
        req.infer(feeds, share_inputs=True)
        return [req.get_output_tensor(i).data for i in range(len(req.model_outputs))]


RUNNERS: dict[str, tuple[str, Callable[[str, int], Any]]] = {
    "onnx": ("onnxruntime", OrtRunner),
    "openvino": ("openvino", OvRunner),
}
BACKEND_CHOICES = ("auto", "torch", *RUNNERS)
AUTO_ORDER = ("onnx", "openvino")  # fastest first, as measured on the 2-vCPU EPYC (docs/LOG.md)


def _bucket(n: int) -> int | None:
    return next((b for b in TOKEN_BUCKETS if b >= n), None)


class ExportedStep:
    """Runs a model's single-segment passes through an exported graph (see the module docstring)."""

    def __init__(self, model: DiffusionLM, name: str, threads: int) -> None:
        check_supported(model)
        self.name, self.model, self.cfg = name, model, model.config
        self._tmp, path = export_to_temp(model)
        self.run = RUNNERS[name][1](str(path), threads)
        n = model.config.n_layers
        self.past_names = [f"past_k{i}" for i in range(n)] + [f"past_v{i}" for i in range(n)]

    def covers(self, seg: Segment) -> bool:
        return seg.cache is not None and _bucket(seg.length) is not None

    def _mask(self, seg: Segment, Tb: int, C: int, past_end: int) -> np.ndarray:
        """Additive mask (1, 1, Tb, C+Tb) over [cache buffer | new tokens]: 0 = may attend."""
        T, cfg = seg.length, self.cfg
        m = np.full((Tb, C + Tb), NEG, dtype=np.float32)  # (Tb, C+Tb)
        m[:T, :past_end] = 0.0
        if T == 1 and Tb == 1:  # the AR step: the cache and itself
            m[0, C] = 0.0
            return m[None, None]
        if seg.overwrite:  # the new tokens replace these cached slots
            m[:T, seg.start : seg.start + T] = NEG
        q = np.arange(seg.start, seg.start + T)  # absolute positions of the new tokens
        if cfg.attention == "causal":
            new = q[None, :] <= q[:, None]  # (T, T)
        elif cfg.attention == "block_causal":
            b = q // cfg.block_size
            new = b[None, :] <= b[:, None]
        else:
            new = np.ones((T, T), dtype=bool)
        m[:T, C : C + T] = np.where(new, np.float32(0.0), NEG)
        idx = np.arange(T, Tb)
        m[idx, C + idx] = 0.0  # padding queries see themselves only (never NaN, never read)
        return m[None, None]

    def forward_segment(self, seg: Segment) -> torch.Tensor | None:
        """Logits (hi - lo, V) of the segment, aligned as ``forward_segments`` returns them, with
        the cache updated the same way; None when the segment is not covered."""
        if not self.covers(seg):
            return None
        cache, cfg, T = seg.cache, self.cfg, seg.length
        assert cache is not None
        Tb = _bucket(T)
        assert Tb is not None
        if seg.overwrite:
            assert seg.start + T <= cache.length, "overwrite inside the cached range only"
            at, past_end = seg.start, cache.length
        else:
            at = past_end = cache.length
            cache.reserve(
                cfg.n_layers, 1, cfg.n_kv_heads, cfg.dim_head, at + T, torch.float32, seg.ids.device
            )
            cache.write_meta(seg.positions[None], None)
        C = cache.capacity
        ids = np.zeros((1, Tb), dtype=np.int64)
        ids[0, :T] = seg.ids.numpy()
        pos = np.full((1, Tb), seg.start + T - 1, dtype=np.int64)
        pos[0, :T] = np.arange(seg.start, seg.start + T)
        feeds: Feeds = {"ids": ids, "pos": pos, "mask": self._mask(seg, Tb, C, past_end)}
        ks, vs = cache.numpy_views()  # (1, Hkv, C, hd) each, sharing the cache's memory
        feeds.update(zip(self.past_names, ks + vs))
        out = self.run(feeds)
        raw = torch.from_numpy(out[0][0, :T].copy())  # (T, V)
        for buf, new in zip(ks + vs, out[1:]):  # numpy writes: no torch dispatch
            buf[:, :, at : at + T] = new[:, :, :T]  # (1, Hkv, T, hd)
        return _aligned(seg, raw, cache, cfg.logit_shift)


def _aligned(seg: Segment, raw: torch.Tensor, cache: KVCache, shift: bool) -> torch.Tensor:
    """The segment's logits [lo, hi) from the raw ones (T, V), logit shift applied, and the cache's
    commit/last_logits bookkeeping (the same as ``DiffusionLM.forward_segments``)."""
    if not shift:
        logits = raw[seg.lo : seg.hi]  # (hi-lo, V)
    elif seg.lo >= 1:
        logits = raw[seg.lo - 1 : seg.hi - 1]
    else:
        first = cache.last_logits.reshape(1, -1) if cache.last_logits is not None else raw[:1]
        logits = torch.cat((first, raw[: seg.hi - 1]))[: seg.hi - seg.lo]  # (hi-lo, V)
    cache.cursor = None
    if seg.append:
        cache.commit(seg.append)
        kept = seg.kept()
        if shift and kept is not None:
            cache.last_logits = raw[kept][None]  # (1, V) raw
    return logits


def available(name: str) -> bool:
    return importlib.util.find_spec(RUNNERS[name][0]) is not None


def resolve_backend(name: str, model: DiffusionLM) -> str:
    """The backend a name means for this model: ``auto`` is the first importable runtime of
    ``AUTO_ORDER`` for a float32 CPU model the graph supports, torch otherwise."""
    if name not in BACKEND_CHOICES:
        raise ConfigError(f"backend must be one of {BACKEND_CHOICES}, got {name!r}")
    if name == "auto":
        try:
            check_supported(model)
        except ConfigError:
            return "torch"
        return next((n for n in AUTO_ORDER if available(n)), "torch")
    if name != "torch" and not available(name):
        raise ConfigError(
            f"backend {name!r} needs the {RUNNERS[name][0]} package: pip install 'quicksilver[cpu]'"
        )
    return name


def attach_backend(model: DiffusionLM, name: str, threads: int | None = None) -> str:
    """Resolve ``name`` and make the model's single-segment passes use it; returns the name used."""
    resolved = resolve_backend(name, model)
    model.step_backend = (
        None
        if resolved == "torch"
        else ExportedStep(model, resolved, threads or torch.get_num_threads())
    )
    return resolved
