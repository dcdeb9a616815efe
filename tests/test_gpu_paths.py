"""What the GPU paths promise, checked on the CPU: the per-sequence SDPA calls never reach cuDNN on
a GPU (the bf16 per-sequence pathology: a cuDNN plan built per new key length), a verify step
uploads nothing per row but its tokens, the static layouts keep one attention shape per bucket
(what CUDA graphs and cuDNN's plan cache need), one host read per diffusion step, and canvas
temporaries bounded whatever the batch."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from quicksilver.bench.syncs import SyncCounter
from quicksilver.runtime import paged, runtime
from quicksilver.runtime.packing import sdpa_backends, token_bucket
from quicksilver.sampling import Decoder, SamplerConfig
from quicksilver.sampling.decoders.noise_canvas import GeneratorNoise, denoise, entropy
from quicksilver.sampling.decoders.verify import VerifyDecoder
from test_packing import _model
from test_step import _mixed, _prompt

MASK, EOS = 2, 1


def test_per_sequence_attention_on_a_gpu_never_runs_cudnn() -> None:
    """cuDNN's SDPA builds an execution plan per new shape (tens of ms of host on an H200, where
    torch tries it first for masked bf16): per-sequence keys grow every step, so it is off there."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    with sdpa_backends(torch.device("cuda"), "per_sequence"):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == was
    for device, layout in [("cpu", "per_sequence"), ("cuda", "batched"), ("cuda", "flex")]:
        with sdpa_backends(torch.device(device), layout):
            assert torch.backends.cuda.cudnn_sdp_enabled() == was


def test_every_packed_pass_runs_inside_the_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def spy(device: torch.device, layout: str) -> Iterator[None]:
        seen.append((device.type, layout))
        yield

    monkeypatch.setattr(runtime, "sdpa_backends", spy)
    dec = VerifyDecoder(_model("causal", "per_sequence"), [EOS], 96)
    sc = SamplerConfig(max_new_tokens=8, temperature=0.0, stop_at_eos=False, draft=4)
    dec.generate([_prompt(0), _prompt(1)], sc)
    assert seen and set(seen) == {("cpu", "per_sequence")}


@pytest.mark.parametrize("layout,extra", [("per_sequence", 0), ("batched", 1), ("flex", 1)])
def test_a_verify_step_uploads_its_tokens_and_at_most_one_plan(layout: str, extra: int) -> None:
    """Per row one upload (its tokens); the layout at most one more per step (the batched draft
    starts, the flex metadata): no per-row upload of a draft start (it was one per row)."""
    dec = VerifyDecoder(_model("causal", layout), [EOS], 96)
    sc = SamplerConfig(max_new_tokens=24, temperature=0.0, stop_at_eos=False, draft=4)
    rows = [dec.new_row(_prompt(i), sc) for i in range(4)]
    dec.step(rows)
    dec.step(rows)
    with SyncCounter() as c:
        dec.step(rows)
    assert c.uploads == len(rows) + extra


@pytest.mark.parametrize("layout", ["per_sequence", "batched", "flex"])
def test_one_host_read_per_diffusion_step(layout: str) -> None:
    dec = Decoder(_model("block_causal", layout), MASK, [EOS], vocab_limit=96)
    rows = [dec.new_row(_prompt(i), _mixed(i)) for i in range(4)]
    for _ in range(3):
        with SyncCounter() as c:
            dec.step(rows)
        assert c.total == 1, dict(c.counts)


def _attention_shapes(layout: str, monkeypatch: pytest.MonkeyPatch) -> set[tuple[int, ...]]:
    """The (queries, keys) shapes of every attention call of a short decode."""
    shapes: set[tuple[int, ...]] = set()
    m = _model("block_causal", layout)
    if layout == "flex":
        orig = paged.flex_kernel("cpu")

        def spy_flex(q, k, v, **kw):  # type: ignore[no-untyped-def]
            shapes.add((q.shape[2], k.shape[2]))
            return orig(q, k, v, **kw)

        monkeypatch.setattr(runtime, "flex_kernel", lambda _: spy_flex)
    else:
        orig_sdpa = runtime.sdpa

        def spy(q, k, v, mask):  # type: ignore[no-untyped-def]
            shapes.add((q.shape[0], q.shape[2], k.shape[2]))
            return orig_sdpa(q, k, v, mask)

        monkeypatch.setattr(runtime, "sdpa", spy)
    dec = Decoder(m, MASK, [EOS], vocab_limit=96)
    cfgs = [_mixed(i).replace(temperature=0.0, max_new_tokens=16) for i in range(2)]
    dec.generate([_prompt(0), _prompt(1)], cfgs)
    return shapes


def test_static_layouts_keep_few_attention_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per sequence, the key axis grows step by step (a new shape per call: the cuDNN plan
    rebuilds); batched pads it to 512, flex reads the whole pool: a handful of shapes per decode."""
    per_seq = _attention_shapes("per_sequence", monkeypatch)
    monkeypatch.undo()
    batched = _attention_shapes("batched", monkeypatch)
    monkeypatch.undo()
    flex = _attention_shapes("flex", monkeypatch)
    assert len(per_seq) >= 6
    assert len(batched) <= 4 and len(flex) <= 2
    assert all(q == token_bucket(q) for q, _ in flex)  # packed tokens padded to their bucket


def test_token_buckets() -> None:
    assert [token_bucket(n) for n in (1, 63, 64, 65, 200, 513)] == [64, 64, 64, 128, 256, 1024]


class LiveBytes(TorchDispatchMode):
    """The peak bytes of new op outputs of at least ``floor`` bytes alive at once inside the block
    (each storage counted once, from the op that made it to its tensor's death; views and in-place
    results of an op's inputs are not new)."""

    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor, self.live, self.peak = floor, 0, 0
        self.ptrs: set[int] = set()

    def _drop(self, ptr: int, n: int) -> None:
        self.ptrs.discard(ptr)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        seen = {a.untyped_storage().data_ptr() for a in flat}  # views and in-place: not new
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if not isinstance(t, torch.Tensor):
                continue
            n, ptr = t.untyped_storage().nbytes(), t.untyped_storage().data_ptr()
            if n >= self.floor and ptr not in self.ptrs and ptr not in seen:
                self.ptrs.add(ptr)
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._drop, ptr, n)
        return out


def test_canvas_temporaries_are_bounded_whatever_the_batch() -> None:
    """DiffusionGemma's step over B canvases of C x V float32 logits: the entropy's temporaries are
    one canvas row at a time (two of them; the old code held four per row, 4 B), so its peak does
    not grow with B; a whole step adds only the B rows' scaled logits (the next self-conditioning)
    and the draw's probabilities, one draw for the batch in transformers' order (freed before the
    entropy)."""
    C, V = 16, 4096
    row = C * V * 4  # one canvas row of float32 logits
    for B in (1, 4):
        logits = torch.randn(B, C, V)
        with LiveBytes(row) as m:
            entropy(logits)
        assert m.peak <= 2 * row
        noise = GeneratorNoise(torch.Generator().manual_seed(0))
        with LiveBytes(row) as m:
            denoise(torch.randn(B, C, V), 0.7, 0.1, noise)
        assert m.peak <= (2 * B + 2) * row  # the old code held 6 B rows at its peak
