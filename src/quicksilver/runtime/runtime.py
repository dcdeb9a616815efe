"""``Runtime``: what makes a ``Transformer`` run fast on one machine, kept apart from its weights.

A runtime owns the pool of decode caches, the attention layout of packed passes (per sequence,
batched, or flex: one FlexAttention call per layer over a paged KV pool, runtime/paged.py), static
shapes and compilation (CUDA graphs of whole flex steps: ``compile_step``), the step backend that serves single-segment
passes outside torch (an exported graph on ONNX Runtime or OpenVINO, or a quantized OpenVINO graph:
runtime/cpu_backends.py, runtime/ov_graph.py), the weight format, and the pass planner with that
backend's cost curve. Decoders and the engine hold a runtime; the network never does.

``forward_segments`` is the packed inference pass: several sequences, each with its own KV cache,
in one call. The projections and the MLP see one (1, sum T_i, C) row (linear layers give every
token the same bits whatever the batch); attention runs as the layout says, so a row's logits never
depend on the other rows of its pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from ..errors import ConfigError
from ..models.host import to_device
from ..models.kvcache import KVCache, KVPool
from ..models.masks import build_attention_mask
from ..models.transformer import Block, Transformer, sdpa
from .packing import LAYOUTS, Layout, PerSequence, plan_batched, sdpa_backends, token_bucket
from .paged import PagedPool, Row, flex_kernel, flex_layout, upload_plan
from .pass_plan import RUNTIMES, PassPlanner, best_draft_count
from .segment import Segment, StepBackend

# a network this large measures its pass times at warm-up, and its planner caps k by them
REAL_SIZE = 100_000_000
PLANNED_KS = (1, 2, 3, 4, 5, 6, 8)


class Runtime:
    """A network and how it runs here (see the module docstring)."""

    def __init__(self, net: Transformer, attention_layout: str = "per_sequence") -> None:
        self.net = net
        self.config = net.config
        # where rows' tensors live: the network's device, or the CPU for a step graph that holds
        # the weights itself (its network on the meta device)
        self.device = net.lm_head.weight.device
        # freed decode caches, reused with what a step backend bound; under the flex layout one
        # paged buffer for every cache (runtime/paged.py)
        self.kv_pool: KVPool | PagedPool = KVPool()
        self.static_shapes = False  # pad packed tokens to buckets (batched layout; CUDA graphs)
        self.step_backend: StepBackend | None = None  # e.g. OpenVINO for every row's CPU passes
        self.quantized = "none"  # weight format (runtime/quantize.py)
        # measured milliseconds of a 1 + k position pass against a cache, by k (measure_passes)
        self.pass_ms: dict[int, float] = {}
        # the whole flex step under torch.compile(mode="reduce-overhead") (compile_step)
        self.captured_step: Callable[..., torch.Tensor] | None = None
        self.attention_layout = "per_sequence"
        self.set_attention_layout(attention_layout)

    @property
    def name(self) -> str:
        """What runs every row's passes: torch, or the step backend's name."""
        return "torch" if self.step_backend is None else self.step_backend.name

    def set_attention_layout(self, name: str) -> None:
        """``per_sequence`` (one attention call per sequence), ``batched`` (one per layer over
        padded rows) or ``flex`` (one per layer over the paged pool, runtime/paged.py)."""
        if name not in LAYOUTS:
            raise ConfigError(f"attention layout must be one of {LAYOUTS}, got {name!r}")
        if self.static_shapes and name == "per_sequence":
            raise ConfigError("static shapes need the batched or flex attention layout")
        if name == "flex" and not isinstance(self.kv_pool, PagedPool):
            cfg, net = self.config, self.net
            dtype = net.model.embed_tokens.weight.dtype
            self.kv_pool = PagedPool(cfg.n_layers, net.kv_heads, cfg.dim_head, dtype, self.device)
        elif name != "flex" and isinstance(self.kv_pool, PagedPool):
            self.kv_pool = KVPool()  # caches made before keep their spans until released
        self.attention_layout = name

    def attach(self, backend: StepBackend | None) -> None:
        """Serve single-segment passes through ``backend`` (None: torch for every pass)."""
        self.kv_pool.clear()  # pooled caches hold the old backend's bindings
        self.step_backend = backend

    def compile_blocks(self, mode: str | None = None, dynamic: bool = True) -> None:
        """torch.compile the per-token parts of every block (MLP and norms; attention stays eager
        because its shapes follow the packed batch). Measured slower on the 2-core CPU (docs/LOG.md);
        meant for GPUs."""
        net = self.net
        for layer in net.model.layers:
            assert isinstance(layer, Block)
            for mod in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm):
                mod.forward = torch.compile(mod.forward, mode=mode, dynamic=dynamic)  # type: ignore[method-assign]
        net.model.norm.forward = torch.compile(net.model.norm.forward, mode=mode, dynamic=dynamic)  # type: ignore[method-assign]

    def compile_static(self) -> None:
        """CUDA graphs: under the flex layout whole steps (``compile_step``); otherwise bucketed
        static shapes (the batched layout, packed tokens padded to a power of two) and
        ``torch.compile(mode="reduce-overhead")`` of the per-token parts, one graph per bucket. On
        a CPU the same code compiles without graphs (for tests)."""
        if self.attention_layout == "flex":
            return self.compile_step()
        self.set_attention_layout("batched")
        self.static_shapes = True
        self.compile_blocks(mode="reduce-overhead", dynamic=False)

    def pass_cost(self, n: int, unread: int = 0) -> int:
        """What a one-sequence cached pass of ``n`` new tokens costs, in positions (the first
        ``unread`` appended without their logits read): the step backend's ``cost``, else ``n``
        (eager torch runs the exact shape)."""
        return n if self.step_backend is None else self.step_backend.cost(n, unread)

    @property
    def planner(self) -> PassPlanner:
        """What a verify pass feeds per row on this runtime (runtime/pass_plan.py)."""
        cap = best_draft_count(self.pass_ms) if self.pass_ms else None
        if self.step_backend is not None:
            return PassPlanner(self.step_backend.pass_policy, self.step_backend.cost, cap)
        return PassPlanner(
            RUNTIMES["cpu" if self.device.type == "cpu" else "accelerator"], max_drafts=cap
        )

    def warm(self, max_len: int) -> int:
        """Compile the step backend's shapes ahead of the first requests; how many (0 on torch).
        A network of a real size (``REAL_SIZE`` parameters and up) also measures its pass times,
        which the planner reads."""
        n = 0 if self.step_backend is None else self.step_backend.warm(max_len)
        if self.parameters() >= REAL_SIZE:
            self.measure_passes()
        return n

    def parameters(self) -> int:
        """The network's parameter count (its meta-device shapes when a step graph holds the
        weights)."""
        return sum(p.numel() for p in self.net.parameters())

    @torch.no_grad()
    def measure_passes(
        self, ks: tuple[int, ...] = PLANNED_KS, context: int = 64, iters: int = 3
    ) -> dict[int, float]:
        """Time a 1 + k position pass against a ``context``-token cache for each k (the median of
        ``iters``), keep the times for the planner and return them."""
        mask = self.config.mask_token_id
        cache = KVCache()
        ids = torch.full((context,), mask, dtype=torch.long)  # (P,)
        self.forward_segments([Segment(ids, 0, context - 1, context, cache, append=context)])
        self.pass_ms = {k: self._pass_ms(cache, context, 1 + k, iters) for k in ks}
        return self.pass_ms

    def _pass_ms(self, cache: KVCache, start: int, width: int, iters: int) -> float:
        ids = torch.full((width,), self.config.mask_token_id, dtype=torch.long)  # (w,)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            self.forward_segments([Segment(ids, start, 0, width, cache, append=0)])
            times.append((time.perf_counter() - t0) * 1e3)
        return sorted(times)[len(times) // 2]

    def forward_segments(self, segments: list[Segment]) -> list[torch.Tensor]:
        """Packed inference forward: one pass for several sequences, each with its own KV cache.

        Returns per segment the logits (hi - lo, V) of its tokens [lo, hi), aligned (shift applied).
        With a step backend attached, every segment it covers runs through it on its own, exactly
        as it would alone (so a row's logits never depend on the other rows of its pass); the
        rest are packed into one torch pass.
        """
        if self.step_backend is None:
            return self._forward_packed(segments)
        out = self.step_backend.forward_each(segments)
        rest = [i for i, o in enumerate(out) if o is None]
        if rest:
            for i, o in zip(rest, self._forward_packed([segments[i] for i in rest])):
                out[i] = o
        return [o for o in out if o is not None]

    def _prepare_caches(self, segments: list[Segment], device: torch.device) -> None:
        """Reserve room for each segment's new keys/values and set where they are written."""
        cfg, net = self.config, self.net
        for s in segments:
            if s.cache is None:
                continue
            if s.overwrite:
                assert s.start + s.length <= s.cache.length, (
                    "overwrite inside the cached range only"
                )
                s.cache.cursor = s.start
                continue
            L, T = s.cache.length, s.length
            dtype = net.model.embed_tokens.weight.dtype
            s.cache.reserve(cfg.n_layers, 1, net.kv_heads, cfg.dim_head, L + T, dtype, device)
            s.cache.cursor = None
            s.cache.write_meta(s.positions[None], None)

    def _forward_packed(self, segments: list[Segment]) -> list[torch.Tensor]:
        """The segments as one packed torch pass (see ``forward_segments``)."""
        ids = torch.cat([s.ids for s in segments])[None]  # (1, Ttot)
        pos = torch.cat([s.positions for s in segments])[None]  # (1, Ttot)
        spans, start = [], 0
        for s in segments:
            spans.append((start, start + s.length))
            start = spans[-1][1]
        flex = self.attention_layout == "flex"
        scratch = self._scratch_caches(segments) if flex else []
        self._prepare_caches(segments, ids.device)
        if self.static_shapes or flex:  # padding tokens at position 0, in no segment: never read
            pad = token_bucket(start) - start
            ids, pos = F.pad(ids, (0, pad)), F.pad(pos, (0, pad))  # (1, Tpad)
        n = int(ids.shape[1])
        max_pos = max(s.start + s.length for s in segments) - 1
        if flex:
            plan = self._flex_plan(segments, spans, scratch, n)
            if self.captured_step is not None:  # static: the rotary tables cover the context
                h = self.captured_step(ids, pos, plan, self.config.max_seq_len - 1)[0]
            else:
                h = self._flex_hidden(ids, pos, plan, max_pos)[0]  # (Tpad, C)
        else:
            layout = self._layout(segments, spans, n)  # caches know the positions

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int) -> torch.Tensor:
                return layout.attend(sdpa, q, k, v, i)

            with sdpa_backends(self.device, self.attention_layout):
                h = self.net.hidden(ids, pos, attend, max_pos)[0]  # (Ttot, C)
        for c in scratch:
            if c is not None:
                c.release()
        return [self._segment_logits(s, h, a) for s, (a, _) in zip(segments, spans)]

    def _scratch_caches(self, segments: list[Segment]) -> list[KVCache | None]:
        """Flex: every segment's keys live in the pool, so an uncached segment gets a cache for
        this pass (released after it); a cache made under another pool moves into it."""
        out: list[KVCache | None] = []
        for s in segments:
            if s.cache is not None:
                s.cache.move_to(self.kv_pool)
                out.append(None)
                continue
            c = KVCache(self.kv_pool)
            dtype = self.net.model.embed_tokens.weight.dtype
            cfg = self.config
            c.reserve(
                cfg.n_layers, 1, self.net.kv_heads, cfg.dim_head, s.length, dtype, self.device
            )
            c.write_meta(s.positions[None], None)
            out.append(c)
        return out

    def _flex_plan(
        self,
        segments: list[Segment],
        spans: list[tuple[int, int]],
        scratch: list[KVCache | None],
        n_tokens: int,
    ) -> torch.Tensor:
        """The flex step's one upload (runtime/paged.py): each row's keys are its span of the pool."""
        cfg, rows = self.config, []
        for s, span, tmp in zip(segments, spans, scratch):
            cache = s.cache if s.cache is not None else tmp
            assert cache is not None and cache.offset is not None
            L = 0 if s.cache is None else cache.length
            write = s.start if s.overwrite else L
            keys = L if s.overwrite else L + s.length
            draft = s.draft_from if cfg.attention == "causal" else None
            off = cache.offset
            rows.append(Row(span, s.start, off + write, off, off + keys, draft))
        assert isinstance(self.kv_pool, PagedPool)
        return upload_plan(self.kv_pool, rows, n_tokens, self.device)

    def _flex_hidden(
        self, ids: torch.Tensor, pos: torch.Tensor, plan: torch.Tensor, max_pos: int
    ) -> torch.Tensor:
        """The network over packed ``ids``/``pos`` (1, Tpad) under the flex plan: (1, Tpad, C).
        No host reads (``max_pos``: the positions' maximum or above), so ``compile_step`` can
        capture it."""
        cfg, pool = self.config, self.kv_pool
        assert isinstance(pool, PagedPool)
        kernel: Callable[..., torch.Tensor] = (  # inside a captured step: the raw op
            flex_attention  # type: ignore[assignment]
            if self.captured_step is not None
            else flex_kernel(self.device.type)
        )
        flex = flex_layout(pool, plan, int(ids.shape[1]), cfg.attention, cfg.block_size, kernel)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int) -> torch.Tensor:
            return flex.attend(None, q, k, v, i)

        return self.net.hidden(ids, pos, attend, max_pos)

    def compile_step(self) -> None:
        """CUDA graphs of whole steps: the flex layout with static shapes, and the network with
        its attention, writes and block mask as one ``torch.compile(mode="reduce-overhead")``
        function of the step's token ids, positions and one upload: one graph per bucket of packed
        tokens (and pool size), replayed each step. On a CPU it compiles without graphs (tests)."""
        self.set_attention_layout("flex")
        self.static_shapes = True
        assert isinstance(self.kv_pool, PagedPool)
        self.kv_pool.mark_static()
        self.net.rotary(
            torch.zeros(1, 1, dtype=torch.long, device=self.device), self.config.max_seq_len - 1
        )
        self.captured_step = torch.compile(self._flex_hidden, mode="reduce-overhead", dynamic=False)

    def _segment_logits(self, s: Segment, h: torch.Tensor, a: int) -> torch.Tensor:
        """Segment ``s``'s logits (hi - lo, V) from the packed hidden states ``h`` (Ttot, C), its
        tokens starting at row ``a``; then the cache's commit and (logit shift) last_logits."""
        head, shift = self.net.lm_head, self.config.logit_shift
        if not shift:
            logits = head(h[a + s.lo : a + s.hi])  # (hi-lo, V)
        elif s.lo >= 1:
            logits = head(h[a + s.lo - 1 : a + s.hi - 1])  # (hi-lo, V): j predicted from j-1
        else:  # the first wanted token's predictor is the last cached one (or itself)
            last = s.cache.last_logits if s.cache is not None else None
            first = head(h[a : a + 1]) if last is None else last  # (1, V)
            rest = head(h[a : a + s.hi - 1])  # (hi-1, V)
            logits = torch.cat((first.reshape(1, -1), rest))[: s.hi - s.lo]
        if s.cache is not None:
            s.cache.cursor = None
            if s.append:
                s.cache.commit(s.append)
                kept = s.kept()
                if shift and kept is not None:
                    s.cache.last_logits = head(h[a + kept : a + kept + 1])  # (1, V) raw
        return logits

    def _segment_mask(self, seg: Segment) -> torch.Tensor | None:
        """The segment's attention mask, or None when every query may see every key."""
        cfg = self.config
        if cfg.attention == "bidirectional":
            return None  # a whole sequence, no padding: every key is visible
        T = seg.length
        first, last = seg.start, seg.start + T - 1
        if cfg.attention == "causal" and T == 1:
            return None
        if cfg.attention == "block_causal" and first // cfg.block_size == last // cfg.block_size:
            return None  # one block against earlier (cached) blocks: all visible
        L = seg.cache.length if seg.cache is not None else 0
        k_pos = seg.positions
        if L:
            assert seg.cache is not None
            k_pos = torch.cat((seg.cache.committed_positions()[0], seg.positions))  # (L+T,)
        q_pos = seg.positions  # (T,)
        if cfg.attention == "causal" and seg.draft:  # the draft block sees the whole row
            q_pos[T - seg.draft :] = last  # draft_horizon, without uploading draft_from
        return build_attention_mask(cfg.attention, cfg.block_size, q_pos[None], k_pos[None], None)

    def _layout(
        self, segments: list[Segment], spans: list[tuple[int, int]], n_tokens: int
    ) -> Layout:
        caches = [s.cache for s in segments]
        if self.attention_layout == "per_sequence":
            return PerSequence(spans, caches, [self._segment_mask(s) for s in segments])
        key_lens = [  # cached keys, plus this pass's unless they overwrite cached ones (dual)
            (0 if s.cache is None else s.cache.length) + (0 if s.overwrite else s.length)
            for s in segments
        ]
        cfg = self.config
        device = segments[0].ids.device
        draft_from = None
        if any(s.draft for s in segments):
            none = cfg.max_seq_len + max(s.start + s.length for s in segments)  # past every query
            draft_from = to_device(
                [none if s.draft_from is None else s.draft_from for s in segments],
                torch.long,
                device,
            )  # (R,)

        def mask(q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor) -> torch.Tensor:
            return build_attention_mask(
                cfg.attention, cfg.block_size, q_pos, k_pos, k_valid, draft_from
            )

        starts = [s.start for s in segments]
        return plan_batched(
            spans, starts, caches, key_lens, mask, cfg.max_seq_len, n_tokens, device
        )


def as_runtime(net: Transformer | Runtime) -> Runtime:
    """``net``'s runtime: a runtime as it is, a network alone on a fresh torch runtime."""
    return net if isinstance(net, Runtime) else Runtime(net)
