"""CPU step backends: the exported step graph (runtime/step_graph.py) run by ONNX Runtime or OpenVINO.

A backend serves every sequence's passes of ``Runtime.forward_segments`` — the AR token step,
the verify pass, the diffusion block step and window step — each on its own, exactly as it would run
alone (``forward_each``), so a row's numbers never depend on the other rows of its step; passes
past the largest token bucket or without a cache return None and eager torch runs them (a step
made ``whole``, the quantized graph's, runs cacheless passes on a scratch cache instead). Shapes are
static per bucket: the new tokens are padded to a bucket of ``TOKEN_BUCKETS`` and the cache is fed
whole (its capacity is a power of two, see ``KVCache``), unused slots masked. The caller (here)
writes the returned keys/values into the ``KVCache``, so torch and the backend share one cache and
can take turns. A causal model's prompt runs its unread head in passes of one model block (the
prefix cache's unit: a block's keys/values are the same whatever the cache held), then the rest in
one pass: a 70-token prompt as 32 + 32 + 6 (in the 8-position shape) rather than 128 positions.
``warm`` compiles the common shapes ahead of the first requests.

Per cache allocation and token bucket a ``Slot`` holds fixed input/output buffers bound to the
runtime once (ONNX Runtime IO binding, OpenVINO tensors over the same memory; the per-layer cache
buffers bound as they are, no copy): a step writes ids, positions and the changed mask columns in
place, runs, and copies the T new keys/values of every layer into the cache in one numpy copy (the
graph returns them stacked in the cache's layout; they cannot be bound in place: the cache slice
of T positions is strided across heads).

Chosen once by name from ``RUNNERS``: ``onnx``, ``openvino`` (both float32, exact to 1e-4) and
``openvino-bf16`` (the same float32 graph and cache, computed in bf16 where the CPU has it: 1.2x the
AR token and 1.5-1.8x the 9- to 64-token steps of the shipped models, logits within ~0.15, their
accuracy unchanged). ``auto`` is the measured winner on a CPU (openvino-bf16 where the CPU has bf16,
else OpenVINO, then ONNX Runtime; docs/LOG.md, 2026-12-01) and torch elsewhere. Checked against
eager torch in tests/test_backend.py.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import importlib.util
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..errors import ConfigError
from ..models.config import ModelConfig
from ..models.kvcache import FIRST_CAPACITY, KVCache, grown_capacity
from ..models.transformer import Transformer
from .pass_plan import RUNTIMES
from .runtime import Runtime
from .segment import Segment
from .step_graph import check_supported, export_to_temp

# new tokens per pass: the AR step, windows (w, or w + 1 with the predictor on the left), a block,
# two blocks (a finished one appended with the next), prefills (padded: compute-bound anyway)
# (buckets to 4,096 hold any pass of a model up to that context; longer passes run in torch)
TOKEN_BUCKETS = (1, 8, 9, 16, 17, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
NEG = np.float32(-np.inf)
log = logging.getLogger("quicksilver")
Feeds = dict[str, np.ndarray]


class Runner(Protocol):
    def bind(self, inputs: Feeds, outs: list[np.ndarray]) -> Callable[[], None]: ...


class OrtRunner:
    """ONNX Runtime on the CPU, one session for every shape, IO binding per slot."""

    def __init__(self, path: str, threads: int) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.ort = ort
        self.session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.outputs = [o.name for o in self.session.get_outputs()]

    def bind(self, inputs: Feeds, outs: list[np.ndarray]) -> Callable[[], None]:
        """Bind the arrays (OrtValues over their memory, no copy) once; the returned call runs the
        graph on whatever they hold and writes the outputs into ``outs``."""
        binding = self.session.io_binding()
        value = self.ort.OrtValue.ortvalue_from_numpy
        for name, a in inputs.items():
            binding.bind_ortvalue_input(name, value(a))
        for name, a in zip(self.outputs, outs):
            binding.bind_ortvalue_output(name, value(a))
        return lambda: self.session.run_with_iobinding(binding)


class OvRunner:
    """OpenVINO on the CPU, one compiled model per (tokens, cache capacity) bucket and one infer
    request per slot, its tensors sharing the slot's memory. ``precision`` is its inference
    precision: f32 (exact to 1e-4), or bf16 (``openvino-bf16``: the same float32 graph, inputs and
    cache, computed in bf16 where the CPU has it; logits within ~0.15 of eager, docs/LOG.md)."""

    def __init__(self, path: str, threads: int, precision: str = "f32") -> None:
        import openvino as ov

        self.ov = ov
        self.core = ov.Core()
        self.core.set_property(
            "CPU",
            {
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": precision,  # f32: no silent bf16 on CPUs that have it
                "PERFORMANCE_HINT": "LATENCY",
            },
        )
        self.path = path
        self.compiled: dict[tuple[int, ...], Any] = {}

    def _compiled(self, inputs: Feeds) -> Any:
        key = tuple(inputs["mask"].shape) + tuple(inputs["past_k0"].shape)
        if key not in self.compiled:
            model = self.core.read_model(self.path)
            model.reshape({name: list(a.shape) for name, a in inputs.items()})
            self.compiled[key] = self.core.compile_model(model, "CPU")
        return self.compiled[key]

    def bind(self, inputs: Feeds, outs: list[np.ndarray]) -> Callable[[], None]:
        """As ``OrtRunner.bind``: the request's input and output tensors are the arrays."""
        req = self._compiled(inputs).create_infer_request()
        for name, a in inputs.items():
            req.set_tensor(name, self.ov.Tensor(a, shared_memory=True))
        for i, a in enumerate(outs):
            req.set_output_tensor(i, self.ov.Tensor(a, shared_memory=True))
        return lambda: req.infer()


@dataclass
class Slot:
    """The fixed buffers of one (cache allocation, token bucket), bound to a runtime once: a step
    writes its inputs into them in place and runs; the outputs land in ``outs``."""

    ids: np.ndarray  # (1, Tb) int64
    pos: np.ndarray  # (1, Tb) int64
    mask: np.ndarray  # (Tb, C+Tb) float32, the (1, 1, Tb, C+Tb) input's memory
    outs: list[np.ndarray]  # logits (1, Tb, V), new keys then values (2 * layers, 1, Hkv, Tb, hd)
    run: Callable[[], None]
    open: int = 0  # the mask's cache columns [0, open) are 0 (may attend) in every row
    # (T, start within the block, draft) of its new-token columns
    part: tuple[int, int, int] | None = None


RUNNERS: dict[str, tuple[str, Callable[[str, int], Runner]]] = {
    "onnx": ("onnxruntime", OrtRunner),
    "openvino": ("openvino", OvRunner),
    "openvino-bf16": ("openvino", lambda path, threads: OvRunner(path, threads, "bf16")),
}
BACKEND_CHOICES = ("auto", "torch", *RUNNERS)
# fastest first, measured on the 2-vCPU EPYC (docs/LOG.md, 2026-12-01); openvino-bf16 only where
# the CPU has bf16 (``available``): the shipped models' accuracy unchanged there (0.323 / 0.509-0.511)
AUTO_ORDER = ("openvino-bf16", "openvino", "onnx")


# a pass's fixed cost in positions' worth of compute, for ``chunk_plan``: 8, 16 and 24 gave the
# same prefill times, 14% under one padded pass (19 prompt lengths of 20-450 tokens, the 2-vCPU
# EPYC, one thread, openvino-bf16; docs/LOG.md, 2026-12-02)
PASS_COST = 16
# prompts up to this many tokens find their shapes compiled at load (``ExportedStep.warm``)
WARM_PREFILL = 256


@functools.lru_cache(maxsize=8)
def _whole_covers(buckets: tuple[int, ...], cost: int) -> list[tuple[float, tuple[int, ...]]]:
    """For every h up to the largest bucket, the cheapest (cost, chunks) cover of h tokens by
    whole buckets, larger ones first on a tie."""
    large_first = sorted(buckets, reverse=True)
    best: list[tuple[float, tuple[int, ...]]] = [(0.0, ())]
    for h in range(1, buckets[-1] + 1):
        choice: tuple[float, tuple[int, ...]] = (math.inf, ())
        for c in large_first:
            if c <= h and c + cost + best[h - c][0] < choice[0]:
                choice = (c + cost + best[h - c][0], (c, *best[h - c][1]))
        best.append(choice)
    return best


@functools.lru_cache(maxsize=4096)
def chunk_plan(
    n: int, max_head: int, buckets: tuple[int, ...], cost: int = PASS_COST
) -> tuple[int, ...]:
    """The passes that compute ``n`` new tokens of a causal stream at the least cost (positions
    computed plus ``cost`` a pass): whole buckets over at most the first ``max_head`` tokens (those
    whose logits are not read), the longest such head on a tie, then the rest in the smallest
    bucket that holds it; () when no bucket holds what must stay in the last pass."""
    heads = _whole_covers(buckets, cost)
    best: tuple[float, tuple[int, ...]] = (math.inf, ())
    for h in range(min(max_head, n - 1, buckets[-1]), max(0, n - buckets[-1]) - 1, -1):
        fit = buckets[bisect.bisect_left(buckets, n - h)]
        if heads[h][0] + fit + cost < best[0]:
            best = (heads[h][0] + fit + cost, (*heads[h][1], n - h))
    return best[1]


def step_buckets(draft: int) -> tuple[int, ...]:
    """``TOKEN_BUCKETS`` plus the two verify passes of a model that drafts ``draft`` tokens: k + 1
    new tokens (the bonus and k masks, after a rejection) and 2k + 1 (with k drafts to check)."""
    extra = {draft + 1, 2 * draft + 1} if draft > 0 else set()
    return tuple(sorted(set(TOKEN_BUCKETS) | extra))


@functools.lru_cache(maxsize=256)
def new_part(attention: str, block: int, T: int, in_block: int, Tb: int, draft: int) -> np.ndarray:
    """Mask columns of a pass's new tokens (Tb, Tb): the attention rule among the T real ones (the
    last ``draft`` of them a draft block that sees them all: ``draft_horizon``; the first at
    ``in_block`` within its block); padding queries see themselves only (never NaN, never read).
    Made once per shape and pattern: a verify row alternates between passes with and without
    masks in one shape. Read-only."""
    q = np.arange(in_block, in_block + T)  # positions relative to the first one's block
    if attention == "causal":
        horizon = np.where(np.arange(T) >= T - draft, in_block + T - 1, q)  # (T,)
        new = q[None, :] <= horizon[:, None]  # (T, T)
    elif attention == "block_causal":
        b = q // block
        new = b[None, :] <= b[:, None]
    else:
        new = np.ones((T, T), dtype=bool)
    part = np.full((Tb, Tb), NEG, dtype=np.float32)
    part[:T, :T] = np.where(new, np.float32(0.0), NEG)
    idx = np.arange(T, Tb)
    part[idx, idx] = 0.0
    part.flags.writeable = False
    return part


class ExportedStep:
    """Runs a model's single-segment passes through a step graph (see the module docstring):
    the traced one (``exported_step``) or one built from the weights (runtime/ov_graph.py)."""

    def __init__(
        self,
        cfg: ModelConfig,
        runner: Runner,
        name: str,
        keep: object = None,
        buckets: tuple[int, ...] | None = None,
        whole: bool = False,
    ) -> None:
        """``buckets``: the token counts a pass is padded to (default ``step_buckets``); ``whole``:
        serve passes without a cache too (on a scratch cache), so that no torch weights are needed
        behind the step (a quantized graph: its numbers, not torch's, for every pass)."""
        self.name, self.cfg, self.runner = name, cfg, runner
        self.pass_policy = RUNTIMES["cpu-exported"]
        self._keep = keep  # what the runner's graph file lives in (a temporary directory)
        n = cfg.n_layers
        self.past_names = [f"past_k{i}" for i in range(n)] + [f"past_v{i}" for i in range(n)]
        self.buckets = buckets or step_buckets(cfg.draft_length)
        self.whole = whole

    def _bucket(self, n: int) -> int | None:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def _plan(self, n: int, unread: int) -> tuple[int, ...]:
        """The passes of ``n`` new tokens whose first ``unread`` are appended unread: causal models
        only, else one pass. The unread head runs in passes of one model block each (the prefix
        cache's unit, engine/prefix_cache.py), so a block's keys/values come from the same pass
        whether its prompt starts fresh or after cached blocks, and a reply never depends on what
        the cache held; the rest in one pass. Models whose block is no bucket of ours take the
        cheapest cover instead (``chunk_plan``)."""
        if self.cfg.attention != "causal" or unread == 0:
            return (n,)  # nothing may run ahead (every decode step)
        B = self.cfg.block_size
        head = unread // B * B
        if B in self.buckets and self._bucket(n - head) is not None:
            return (B,) * (head // B) + (n - head,) if head else (n,)
        return chunk_plan(n, unread, self.buckets) or (n,)

    def cost(self, n: int, unread: int = 0) -> int:
        """What a pass of ``n`` new tokens costs in positions (the first ``unread`` appended
        unread): its buckets' positions plus ``PASS_COST`` for each extra pass; past the largest
        bucket eager torch runs the exact shape."""
        plan = self._plan(n, unread)
        return sum(self._bucket(c) or c for c in plan) + PASS_COST * (len(plan) - 1)

    def covers(self, seg: Segment) -> bool:
        return (self.whole or seg.cache is not None) and self._bucket(seg.length) is not None

    def warm(self, max_len: int, prefill: int = WARM_PREFILL) -> int:
        """Compile and run once the shapes a sequence of up to ``max_len`` positions uses, so that
        no request pays a compile (~0.3 s a shape): the decode buckets (up to 32 new tokens) at every
        cache capacity and the prefill buckets up to ``prefill`` at capacities up to twice that.
        Each shape holds its own compiled copy of the weights (~35 MB for the shipped model), so
        longer prompts' shapes are left to their first use. Returns how many shapes it ran."""
        cfg, n, C = self.cfg, 0, FIRST_CAPACITY  # then doubled, as ``KVCache.reserve`` does
        while True:
            for Tb in self.buckets:
                if Tb > C or (Tb > 32 and (Tb > prefill or C > 2 * prefill)):
                    continue
                past = np.zeros((1, cfg.n_kv_heads, C, cfg.dim_head), dtype=np.float32)
                inputs: Feeds = {
                    "ids": np.zeros((1, Tb), dtype=np.int64),
                    "pos": np.zeros((1, Tb), dtype=np.int64),
                    "mask": np.zeros((1, 1, Tb, C + Tb), dtype=np.float32),
                }
                inputs.update((name, past) for name in self.past_names)
                new = (2 * cfg.n_layers, 1, cfg.n_kv_heads, Tb, cfg.dim_head)
                outs = [np.empty((1, Tb, cfg.vocab_size), np.float32), np.empty(new, np.float32)]
                self.runner.bind(inputs, outs)()
                n += 1
            if C >= max_len:
                return n
            C *= 2

    def _slot(self, cache: KVCache, Tb: int) -> Slot:
        """This cache allocation's slot for bucket Tb, made and bound on first use."""
        slot = cache.step_slots.get((self, Tb))
        if isinstance(slot, Slot):
            return slot
        cfg, C = self.cfg, cache.capacity
        ids, pos = np.zeros((1, Tb), dtype=np.int64), np.zeros((1, Tb), dtype=np.int64)
        mask = np.full((1, 1, Tb, C + Tb), NEG, dtype=np.float32)  # (1, 1, Tb, C+Tb)
        new = (2 * cfg.n_layers, 1, cfg.n_kv_heads, Tb, cfg.dim_head)
        outs = [np.empty((1, Tb, cfg.vocab_size), dtype=np.float32), np.empty(new, np.float32)]
        kv = cache.numpy_views()[0]  # (2n, 1, Hkv, C, hd), sharing the cache's memory
        inputs: Feeds = {"ids": ids, "pos": pos, "mask": mask}
        inputs.update(zip(self.past_names, kv))  # (1, Hkv, C, hd) each
        run = self.runner.bind(inputs, outs)
        slot = Slot(ids, pos, mask[0, 0], outs, run)
        cache.step_slots[self, Tb] = slot
        return slot

    def _fill(self, slot: Slot, seg: Segment, C: int, past_end: int) -> None:
        """Write the segment's ids, positions and mask into the slot, the mask incrementally: cache
        columns [0, past_end) open (all rows; padding rows are never read), the overwritten ones
        closed (reopened by ``forward_segment`` after the run), the new-token part when it changes."""
        T, start, m = seg.length, seg.start, slot.mask
        slot.ids[0, :T] = seg.ids.numpy()
        slot.pos[0, :T] = np.arange(start, start + T)
        slot.pos[0, T:] = start + T - 1
        if past_end > slot.open:
            m[:, slot.open : past_end] = 0.0
        elif past_end < slot.open:
            m[:, past_end : slot.open] = NEG
        slot.open = past_end
        if seg.overwrite:  # the new tokens replace these cached slots
            m[:, start : start + T] = NEG
        in_block = start % self.cfg.block_size if self.cfg.attention == "block_causal" else 0
        if slot.part != (T, in_block, seg.draft):
            cfg = self.cfg
            m[:, C:] = new_part(cfg.attention, cfg.block_size, T, in_block, m.shape[0], seg.draft)
            slot.part = (T, in_block, seg.draft)

    def forward_segment(self, seg: Segment) -> torch.Tensor | None:
        """Logits (hi - lo, V) of the segment, aligned as ``forward_segments`` returns them, with
        the cache updated the same way; None when the segment is not covered. Leading tokens whose
        logits are not read run first as whole-bucket chunks where the plan says so."""
        if not self.covers(seg):
            return None
        if seg.cache is None:  # a whole step's pass without a cache: a scratch one, kept nothing
            seg = dataclasses.replace(seg, cache=KVCache(), append=0)
        cache = seg.cache
        assert cache is not None
        plan = (
            (seg.length,)
            if seg.overwrite
            else self._plan(seg.length, _unread(seg, self.cfg.logit_shift))
        )
        head = sum(plan[:-1])
        if head:
            cfg, at = self.cfg, cache.length
            # the whole segment's capacity at once: one cache shape for every chunk
            cache.reserve(
                cfg.n_layers,
                1,
                cfg.n_kv_heads,
                cfg.dim_head,
                at + seg.length,
                torch.float32,
                seg.ids.device,
            )
            s = 0
            for c in plan[:-1]:
                part = Segment(
                    seg.ids[s : s + c], seg.start + s, c - 1, c, cache, append=c, keep=-1
                )
                self._pass(part)  # appended; its logits unread, the cache's last_logits untouched
                s += c
            seg = _rest(seg, head)
        return self._pass(seg)

    def forward_each(self, segs: list[Segment]) -> list[torch.Tensor | None]:
        """``forward_segment`` of every segment on its own, those of one compiled shape back to
        back: each shape holds its own copy of the weights, and a pass right after one of the same
        shape finds them in cache (docs/LOG.md, 2026-12-03). The order changes no result."""
        out: list[torch.Tensor | None] = [None] * len(segs)
        for i in sorted(range(len(segs)), key=lambda i: self._shape(segs[i])):
            out[i] = self.forward_segment(segs[i])
        return out

    def _shape(self, seg: Segment) -> tuple[int, int]:
        """(cache capacity, token bucket) of the segment's last pass; (0, 0) when not covered."""
        if not self.covers(seg) or seg.cache is None:
            return (0, 0)
        cap = grown_capacity(seg.cache.capacity, seg.cache.length + seg.length)
        return cap, self._bucket(seg.length) or 0

    def _pass(self, seg: Segment) -> torch.Tensor:
        """One exported run of a covered segment (see ``forward_segment``)."""
        cache, cfg, T = seg.cache, self.cfg, seg.length
        assert cache is not None
        Tb = self._bucket(T)
        assert Tb is not None
        if seg.overwrite:
            assert seg.start + T <= cache.length, "overwrite inside the cached range only"
            at, past_end = seg.start, cache.length
        else:
            at = past_end = cache.length
            cache.reserve(
                cfg.n_layers, 1, cfg.n_kv_heads, cfg.dim_head, at + T, torch.float32, seg.ids.device
            )
            cache.write_meta_range(seg.start, T)
        slot = self._slot(cache, Tb)
        self._fill(slot, seg, cache.capacity, past_end)
        slot.run()
        if seg.overwrite:
            slot.mask[:, at : at + T] = 0.0
        a, b = _rows_read(seg, cfg.logit_shift)
        raw = torch.from_numpy(slot.outs[0][0, a:b].copy())  # (b-a, V): the slot's buffer is reused
        cache.numpy_views()[0][..., at : at + T, :] = slot.outs[1][
            ..., :T, :
        ]  # (2n, 1, Hkv, T, hd)
        return _aligned(seg, raw, a, cache, cfg.logit_shift)


def _unread(seg: Segment, shift: bool) -> int:
    """How many leading tokens of the segment are appended without their logits being read: the
    ones before its first read row, its kept row and its draft block."""
    a, _ = _rows_read(seg, shift)
    return min(a, seg.append, seg.length - seg.draft)


def _rest(seg: Segment, head: int) -> Segment:
    """The segment after its first ``head`` tokens, once they are in the cache."""
    keep = seg.keep if seg.keep is None or seg.keep < 0 else seg.keep - head
    return Segment(
        seg.ids[head:],
        seg.start + head,
        seg.lo - head,
        seg.hi - head,
        seg.cache,
        append=seg.append - head,
        keep=keep,
        draft=seg.draft,
    )


def _rows_read(seg: Segment, shift: bool) -> tuple[int, int]:
    """The rows [a, b) of the segment's raw logits that ``_aligned`` reads: a prefill's one, not
    its every position."""
    if not shift:
        return seg.lo, seg.hi
    kept = seg.kept() if seg.append else None
    a = max(seg.lo - 1, 0) if kept is None else min(max(seg.lo - 1, 0), kept)
    return a, max(seg.hi, (kept or 0) + 1)  # [lo - 1, hi - 1) and the kept row, within [a, b)


def _aligned(seg: Segment, raw: torch.Tensor, a: int, cache: KVCache, shift: bool) -> torch.Tensor:
    """The segment's logits [lo, hi) from its raw ones, rows [a, a + len(raw)) (n, V), logit shift
    applied, and the cache's commit/last_logits bookkeeping (as ``Runtime.forward_segments``)."""
    if not shift:
        logits = raw  # (hi-lo, V)
    elif seg.lo >= 1:
        logits = raw[seg.lo - 1 - a : seg.hi - 1 - a]
    else:
        first = cache.last_logits.reshape(1, -1) if cache.last_logits is not None else raw[:1]
        logits = torch.cat((first, raw[: seg.hi - 1 - a]))[: seg.hi - seg.lo]  # (hi-lo, V)
    cache.cursor = None
    if seg.append:
        cache.commit(seg.append)
        kept = seg.kept()
        if shift and kept is not None:
            cache.last_logits = raw[kept - a][None]  # (1, V) raw
    return logits


@functools.cache
def native_bf16() -> bool:
    """Whether OpenVINO computes bf16 natively on this CPU (AVX-512 BF16 or AMX)."""
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def installed(name: str) -> bool:
    return importlib.util.find_spec(RUNNERS[name][0]) is not None


def available(name: str) -> bool:
    """The runtime's package is installed (and, for ``openvino-bf16``, the CPU has bf16)."""
    return installed(name) and (name != "openvino-bf16" or native_bf16())


def resolve_backend(name: str, runtime: Runtime) -> str:
    """The backend a name means for this model: ``auto`` is the first importable runtime of
    ``AUTO_ORDER`` for a float32 CPU model the graph supports, torch otherwise."""
    if name not in BACKEND_CHOICES:
        raise ConfigError(f"backend must be one of {BACKEND_CHOICES}, got {name!r}")
    if name == "auto":
        try:
            check_supported(runtime.net, runtime.quantized)
        except ConfigError as e:
            log.warning("--backend auto runs this model in torch: %s", e)
            return "torch"
        found = next((n for n in AUTO_ORDER if available(n)), None)
        if found is None:
            log.warning("--backend auto runs in torch: no ONNX Runtime or OpenVINO is installed")
        return found or "torch"
    if name != "torch" and not installed(name):
        raise ConfigError(
            f"backend {name!r} needs the {RUNNERS[name][0]} package: pip install 'quicksilver[cpu]'"
        )
    if name != "torch" and not available(name):
        raise ConfigError(f"backend {name!r} needs a CPU with bf16 arithmetic; use openvino")
    return name


def exported_step(model: Transformer, name: str, threads: int) -> ExportedStep:
    """The traced step of ``model`` (float32) on runner ``name`` (one of ``RUNNERS``)."""
    check_supported(model)
    tmp, path = export_to_temp(model)
    return ExportedStep(model.config, RUNNERS[name][1](str(path), threads), name, keep=tmp)


def attach_backend(runtime: Runtime, name: str, threads: int | None = None) -> str:
    """Resolve ``name`` and make the runtime's single-segment passes use it; the name used."""
    resolved = resolve_backend(name, runtime)
    threads = threads or torch.get_num_threads()
    runtime.attach(None if resolved == "torch" else exported_step(runtime.net, resolved, threads))
    return resolved
