"""CPU step backends (ONNX Runtime, OpenVINO) against eager torch, and the decode window.

Tolerance of the exported float32 step: logits within 1e-4 absolute of eager torch (measured max
1.7e-5 on the shipped AR twin); greedy tokens identical. ``openvino-bf16`` computes in bf16: logits
within 0.5 (measured max 0.12-0.2 on the shipped models), the greedy choice the same at >= 95% of
teacher-forced positions.
"""

from __future__ import annotations

import pytest
import torch

import quicksilver
from quicksilver.assets import (
    embedded_ar_model_path,
    embedded_diffusion_model_path,
)
from quicksilver.errors import ConfigError
from quicksilver.models.kvcache import KVCache
from quicksilver.runtime.cpu_backends import (
    PASS_COST,
    attach_backend,
    chunk_plan,
    native_bf16,
    resolve_backend,
    step_buckets,
)
from quicksilver.runtime.segment import Segment
from quicksilver.sampling import SamplerConfig
from quicksilver.sampling.core.caches import resolve_window
from quicksilver.sampling.decoders.autoregressive import ar_generate

RUNTIMES = ["onnx", "openvino"]
ATOL = 1e-4
BF16_ATOL = 0.5


@pytest.fixture(scope="module")
def ar_pipe():  # type: ignore[no-untyped-def]
    return quicksilver.load(embedded_ar_model_path())


@pytest.fixture(scope="module")
def dlm_pipes():  # type: ignore[no-untyped-def]
    return {
        b: quicksilver.load(embedded_diffusion_model_path(), backend=b)
        for b in ["torch", *RUNTIMES]
    }


class Spy:
    """Counts the segments a model's exported step ran (non-None results), so a backend test can
    show its backend ran rather than torch behind a declining ``covers``."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.step, self.ran = model.step_backend, 0
        assert self.step is not None, "no exported step attached"
        inner = self.step.forward_segment

        def counted(seg):  # type: ignore[no-untyped-def]
            out = inner(seg)
            self.ran += out is not None
            return out

        self.step.forward_segment = counted

    def close(self) -> int:
        del self.step.forward_segment  # back to the class's method
        return self.ran


def _prompt(pipe) -> list[int]:  # type: ignore[no-untyped-def]
    return pipe.tokenizer.encode("Tell me a story about a cat who learns to sing.")


@torch.no_grad()
def _teacher_forced(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits (len(tokens), V) of AR steps fed ``tokens`` one by one after the prompt."""
    cache, out, x, start = KVCache(), [], torch.tensor(prompt), 0
    for t in tokens:
        T = int(x.shape[0])
        out.append(model.forward_segments([Segment(x, start, T - 1, T, cache, append=T)])[0])
        start, x = start + T, torch.tensor([t])
    return torch.cat(out)


@pytest.mark.parametrize("name", RUNTIMES)
def test_ar_step_equals_eager(ar_pipe, name: str) -> None:  # type: ignore[no-untyped-def]
    model, prompt = ar_pipe.runtime, _prompt(ar_pipe)
    attach_backend(model, "torch")
    ref = ar_generate(model, prompt, 150, []).tokens
    ref_logits = _teacher_forced(model, prompt, ref[:80])
    try:
        assert attach_backend(model, name) == name
        assert model.step_backend is not None and model.step_backend.name == name
        spy = Spy(model)
        logits = _teacher_forced(model, prompt, ref[:80])
        assert (logits - ref_logits).abs().max().item() < ATOL
        assert ar_generate(model, prompt, 150, []).tokens == ref  # crosses cache capacity 64 -> 256
        assert spy.close() >= 80 + 149  # every one-token step ran in the exported graph
    finally:
        attach_backend(model, "torch")


@pytest.mark.parametrize("pipe", ["ar", "dlm"])
def test_openvino_bf16_stays_close_to_eager(ar_pipe, dlm_pipes, pipe: str) -> None:  # type: ignore[no-untyped-def]
    if not native_bf16():
        pytest.skip("this CPU has no bf16 arithmetic")
    p = ar_pipe if pipe == "ar" else dlm_pipes["torch"]
    model, prompt = p.runtime, _prompt(p)
    attach_backend(model, "torch")
    ref = ar_generate(ar_pipe.runtime, prompt, 80, []).tokens  # a plausible continuation for both
    ref_logits = _teacher_forced(model, prompt, ref)
    try:
        assert attach_backend(model, "openvino-bf16") == "openvino-bf16"
        spy = Spy(model)
        logits = _teacher_forced(model, prompt, ref)
        assert spy.close() == len(ref)
        drift = (logits - ref_logits).abs().max().item()
        agree = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
        assert 0 < drift < BF16_ATOL and agree >= 0.95  # > 0: it does compute in bf16
    finally:
        attach_backend(model, "torch")


@pytest.mark.parametrize("name", RUNTIMES)
def test_bound_slot_follows_truncation_and_torch_turns(ar_pipe, name: str) -> None:  # type: ignore[no-untyped-def]
    """A slot's mask is updated in place: it must follow a cache that shrinks (truncate) and one
    that torch wrote in between, step for step equal to eager torch on a twin cache."""
    model, prompt = ar_pipe.runtime, _prompt(ar_pipe)

    def steps(backend: str) -> tuple[torch.Tensor, int]:
        """The planned steps' logits, and how many of them the exported graph ran."""
        attach_backend(model, backend)
        step, cache, out = model.step_backend, KVCache(), []
        spy = Spy(model) if step is not None else None
        with torch.no_grad():
            for i, plan in enumerate(["prefill", 1, 1, 1, "cut", 1, 1, "torch", 1, 1]):
                model.step_backend = None if plan in ("prefill", "torch") else step
                if plan == "cut":
                    cache.truncate(cache.length - 2)
                    continue
                x = torch.tensor(prompt if plan == "prefill" else [5 + i])  # (T,)
                T = int(x.shape[0])
                seg = Segment(x, cache.length, T - 1, T, cache, append=T)
                out.append(model.forward_segments([seg])[0])
        model.step_backend = step
        return torch.cat(out), spy.close() if spy is not None else 0

    try:
        ref, _ = steps("torch")
        got, ran = steps(name)
        assert (got - ref).abs().max().item() < ATOL
        assert ran == 7  # the seven steps planned for the exported graph
    finally:
        attach_backend(model, "torch")


def test_a_prefill_longer_than_384_tokens_runs_in_the_exported_graph(ar_pipe) -> None:  # type: ignore[no-untyped-def]
    """The buckets reach the model's context: a 700-token prefill runs in the exported graph (it
    ran in torch when the largest bucket was 384), its logits those of torch."""
    model = ar_pipe.runtime
    ids = (_prompt(ar_pipe) * 64)[:700]
    assert len(ids) == 700 < model.config.max_seq_len

    def prefill() -> torch.Tensor:
        with torch.no_grad():
            seg = Segment(torch.tensor(ids), 0, 0, len(ids), KVCache(), append=len(ids))
            return model.forward_segments([seg])[0]

    attach_backend(model, "torch")
    ref = prefill()
    try:
        attach_backend(model, "openvino")
        spy = Spy(model)
        got = prefill()
        assert spy.close() == 1
        assert (got - ref).abs().max().item() < ATOL
    finally:
        attach_backend(model, "torch")


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_prompt_runs_in_block_sized_chunks_then_the_rest(ar_pipe, name: str) -> None:  # type: ignore[no-untyped-def]
    """A 70-token prompt computes 32 + 32 + 8 positions (its unread head in passes of one model
    block, the prefix cache's unit), not the 128 of its bucket: three exported runs, the logits,
    the cache and the greedy reply after it those of eager torch."""
    model = ar_pipe.runtime
    prompt = (_prompt(ar_pipe) * 8)[:70]
    attach_backend(model, "torch")
    ref = ar_generate(model, prompt, 40, []).tokens
    ref_logits = _teacher_forced(model, prompt, ref[:20])
    try:
        attach_backend(model, name)
        step = model.step_backend
        assert step is not None and model.pass_cost(70, 69) == 32 + 32 + 8 + 2 * PASS_COST
        assert model.pass_cost(70) == 128  # every row's logits read: one pass
        runs = []
        one = step._pass
        step._pass = lambda seg: runs.append(seg.length) or one(seg)  # type: ignore[method-assign]
        logits = _teacher_forced(model, prompt, ref[:20])
        assert runs[:3] == [32, 32, 6]  # the prefill; then one-token steps
        assert (logits - ref_logits).abs().max().item() < ATOL
        assert ar_generate(model, prompt, 40, []).tokens == ref
    finally:
        attach_backend(model, "torch")


def test_chunk_plans_take_whole_buckets_then_the_rest() -> None:
    B = step_buckets(8)
    assert chunk_plan(20, 19, B) == (20,) and chunk_plan(200, 199, B) == (128, 64, 8)
    assert chunk_plan(70, 69, B) == (64, 6) and chunk_plan(70, 60, B) == (8, 62)  # 64 > 60
    assert chunk_plan(17, 0, B) == (17,) and chunk_plan(33, 32, B) == (32, 1)
    for n in range(1, 700):
        plan = chunk_plan(n, n - 1, B)
        assert sum(plan) == n and all(c in B for c in plan[:-1])


def _items(pipe, n: int = 2) -> list[list[int]]:  # type: ignore[no-untyped-def]
    from quicksilver.suite.render import prompt_text
    from quicksilver.suite.tasks import get_task

    tok = pipe.tokenizer
    return [
        tok.encode(prompt_text(it, tok, False))
        for t in ("chat", "tool_call", "multiply")
        for it in get_task(t).test_items(n, 1234)
    ]


@pytest.mark.parametrize("window", [32, 8])
@pytest.mark.parametrize("name", RUNTIMES)
def test_diffusion_step_equals_eager(dlm_pipes, name: str, window: int) -> None:  # type: ignore[no-untyped-def]
    ref, other = dlm_pipes["torch"], dlm_pipes[name]
    cfg = SamplerConfig(max_new_tokens=80, window=window)
    spy = Spy(other.runtime)
    try:
        for ids in _items(ref):
            before = spy.ran
            got = other.decoder.generate([ids], cfg)[0]
            assert got.tokens == ref.decoder.generate([ids], cfg)[0].tokens
            assert spy.ran - before == got.nfe  # every pass ran in the exported graph
            # the logits, not only the tokens: a first diffusion step of the same row
            with torch.no_grad():
                a = ref.runtime.forward_segments([ref.decoder.new_row(ids, cfg).segment()])[0]
                b = other.runtime.forward_segments([other.decoder.new_row(ids, cfg).segment()])[0]
            assert (a - b).abs().max().item() < ATOL
    finally:
        spy.close()


def test_window_of_the_whole_block_is_the_block_cache(dlm_pipes, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """window = the model block is exact: the plain block cache (what a GPU runs by default)."""
    from quicksilver.sampling.core import caches

    dec = dlm_pipes["torch"].decoder
    items = _items(dlm_pipes["torch"])
    cfg = SamplerConfig(max_new_tokens=64, window=32)
    assert {dec.new_row(ids, cfg).cache_mode for ids in items} == {"block"}
    full = [dec.generate([ids], cfg)[0].tokens for ids in items]
    monkeypatch.setitem(caches.WINDOW_DEFAULTS, "cpu", None)
    assert [
        dec.generate([ids], SamplerConfig(max_new_tokens=64))[0].tokens for ids in items
    ] == full


def test_window_first_step_is_exact(dlm_pipes) -> None:  # type: ignore[no-untyped-def]
    """A window's first step in a model block recomputes the block: the same logits as the block cache."""
    dec = dlm_pipes["torch"].decoder
    ids = _items(dlm_pipes["torch"], 1)[0]
    full = dec.new_row(ids, SamplerConfig(max_new_tokens=64, window=32))
    win = dec.new_row(ids, SamplerConfig(max_new_tokens=64, window=8))
    assert win.cache_mode == "window" and win.block_length == 8
    with torch.no_grad():
        a = dec.runtime.forward_segments([full.segment()])[0]  # (n, V), the block's first window
        b = dec.runtime.forward_segments([win.segment()])[0]  # (w, V)
    # the same computation; a matmul over 8 rows may take another kernel than over 32 (AMX, oneDNN)
    assert torch.allclose(a[: b.shape[0]], b, atol=1e-5, rtol=0)


def test_window_rows_batch_like_batch_one(dlm_pipes) -> None:  # type: ignore[no-untyped-def]
    dec = dlm_pipes["torch"].decoder
    items = _items(dlm_pipes["torch"])
    cfg = SamplerConfig(max_new_tokens=64, window=8)
    alone = [dec.generate([ids], cfg)[0].tokens for ids in items]
    assert [r.tokens for r in dec.generate(items, cfg)] == alone


def test_backend_option_validation(ar_pipe) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="backend must be one of"):
        resolve_backend("tensorrt", ar_pipe.runtime)
    with pytest.raises(ConfigError, match="backend must be one of"):
        quicksilver.load(embedded_ar_model_path(), backend="fast")
    assert resolve_backend("auto", ar_pipe.runtime) == (
        "openvino-bf16" if native_bf16() else "openvino"
    )
    bf16 = quicksilver.load(embedded_ar_model_path(), dtype=torch.bfloat16)
    assert resolve_backend("auto", bf16.runtime) == "torch"  # the graph is float32 only
    with pytest.raises(ConfigError, match="does not support"):
        attach_backend(bf16.runtime, "onnx")


def test_openvino_bf16_needs_a_bf16_cpu(ar_pipe, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import quicksilver.runtime.cpu_backends as cb

    monkeypatch.setattr(cb, "native_bf16", lambda: False)
    assert resolve_backend("auto", ar_pipe.runtime) == "openvino"
    with pytest.raises(ConfigError, match="needs a CPU with bf16"):
        resolve_backend("openvino-bf16", ar_pipe.runtime)


def test_window_option_validation(dlm_pipes, ar_pipe) -> None:  # type: ignore[no-untyped-def]
    dec = dlm_pipes["torch"].decoder
    with pytest.raises(ConfigError, match="positive integer"):
        dec.new_row([5, 6], SamplerConfig(window=0))
    with pytest.raises(ConfigError, match="divide"):
        dec.new_row([5, 6], SamplerConfig(window=5))
    with pytest.raises(ConfigError, match="block-causal"):
        ar_pipe.decoder.new_row([5, 6], SamplerConfig(window=8))
    assert resolve_window(None, 32, "block", "cuda") == 32
    assert resolve_window(None, None, "none", "cpu") == 0


def test_cache_capacity_is_a_power_of_two() -> None:
    cache = KVCache()
    for need in (1, 65, 100, 300):
        cache.reserve(1, 1, 1, 4, need, torch.float32, torch.device("cpu"))
        cap = cache.capacity
        assert cap >= need and cap & (cap - 1) == 0


def test_bench_steps_reports_every_backend_and_shape(capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from quicksilver.cli import main

    argv = ["bench", "steps", "--backends", "torch,onnx", "--threads", "1", "--rounds", "1"]
    assert main([*argv, "--repeats", "1", "--context", "64"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(out["ms"]) == {"torch", "onnx"}
    shapes = {"ar_token", "step_8", "step_9", "step_32", "step_64", "verify_4", "verify_8"}
    assert set(out["ms"]["onnx"]["1"]) == shapes


def test_window_rows_skip_prefilled_sub_blocks(dlm_pipes) -> None:  # type: ignore[no-untyped-def]
    """Prefilled sub-blocks (structured output's skeleton) may make a row skip a block's start."""
    dec = dlm_pipes["torch"].decoder
    ids = _items(dlm_pipes["torch"], 1)[0]
    first = 32 - len(ids) % 32  # canvas offset of the second model block
    prefill = {p: 5 for p in range(first, first + 8)}  # its whole first sub-block
    row = dec.new_row(
        ids, SamplerConfig(max_new_tokens=64, window=8, stop_at_eos=False), prefill=prefill
    )
    gen = dec.drive([row])
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            (res,) = stop.value
            break
    assert len(res.tokens) == 64 and all(res.tokens[p] == 5 for p in prefill)


@pytest.mark.parametrize("name", RUNTIMES)
def test_a_pooled_cache_keeps_its_bindings_and_stays_exact(ar_pipe, name: str) -> None:  # type: ignore[no-untyped-def]
    """A finished request's cache goes back to the model's pool with the runtime buffers bound to
    it: the next request of the same shapes binds nothing new, and the stale keys/values a longer
    request left behind change no token."""
    model = ar_pipe.runtime
    long_prompt = _prompt(ar_pipe) * 3
    short_prompt = ar_pipe.tokenizer.encode("Write a haiku about rain.")
    attach_backend(model, "torch")
    ref = ar_generate(model, short_prompt, 60, []).tokens
    try:
        attach_backend(model, name)
        step = model.step_backend
        binds = []
        inner = step.runner.bind

        def counted(inputs, outs):  # type: ignore[no-untyped-def]
            binds.append(inputs["mask"].shape)
            return inner(inputs, outs)

        step.runner.bind = counted
        ar_generate(model, long_prompt, 60, [])  # leaves its keys/values in the pooled memory
        assert ar_generate(model, short_prompt, 60, []).tokens == ref
        first = len(binds)
        assert first > 0 and model.kv_pool.hits > 0
        assert ar_generate(model, short_prompt, 60, []).tokens == ref
        assert len(binds) == first  # every slot of the second run came from the pool
    finally:
        attach_backend(model, "torch")


def test_kv_pool_reuses_by_shape_and_evicts_beyond_its_budget() -> None:
    from quicksilver.models.kvcache import KVPool

    pool = KVPool(
        max_bytes=3 * 2 * 64 * 4 * 4 + 3 * 64 * 9
    )  # room for three (1, 1, 1, 64, 4) caches
    cpu = torch.device("cpu")
    caches = [KVCache(pool) for _ in range(4)]
    for c in caches:
        c.reserve(1, 1, 1, 4, 10, torch.float32, cpu)
        c.commit(5)
    memory = [c.kv.data_ptr() for c in caches]  # type: ignore[union-attr]
    for c in caches:
        c.release()
        assert c.length == 0 and c.capacity == 0
    assert pool.bytes <= pool.max_bytes and len(pool._free) == 3  # the oldest was evicted
    again = KVCache(pool)
    again.reserve(1, 1, 1, 4, 10, torch.float32, cpu)
    assert again.kv.data_ptr() in memory[1:]  # type: ignore[union-attr]
    other = KVCache(pool)
    other.reserve(1, 1, 2, 4, 10, torch.float32, cpu)  # another shape: fresh memory
    assert other.kv.data_ptr() not in memory  # type: ignore[union-attr]
    grown = KVCache(pool)
    grown.reserve(1, 1, 1, 4, 10, torch.float32, cpu)
    grown.k[0][:, :, :3] = 7.0
    grown.commit(3)
    grown.reserve(1, 1, 1, 4, 100, torch.float32, cpu)  # grows: keeps what is committed
    assert grown.capacity == 128 and bool((grown.k[0][:, :, :3] == 7.0).all())
    assert len(pool._free) == 2  # the 64-slot memory it grew out of went back


def test_warm_compiles_every_shape_a_generation_then_uses(ar_pipe) -> None:  # type: ignore[no-untyped-def]
    """After ``warm``, prompts up to its prefill bound and the decode passes after them compile
    nothing new (no request pays a compile)."""
    model = ar_pipe.runtime
    try:
        attach_backend(model, "openvino")
        step = model.step_backend
        n = step.warm(model.config.max_seq_len)
        compiled = set(step.runner.compiled)
        assert n == len(compiled) > 10
        for length in (5, 40, 70, 200):
            ar_generate(model, (_prompt(ar_pipe) * 20)[:length], 30, [])
        assert set(step.runner.compiled) == compiled
    finally:
        attach_backend(model, "torch")


def test_rows_of_one_shape_run_back_to_back_and_keep_their_order(ar_pipe) -> None:  # type: ignore[no-untyped-def]
    """``forward_each`` groups segments by compiled shape; each result lands at its own index."""
    model = ar_pipe.runtime
    try:
        attach_backend(model, "openvino")
        step = model.step_backend
        prompts = [_prompt(ar_pipe)[:n] for n in (5, 9, 6, 9)]
        segs = [
            Segment(torch.tensor(p), 0, len(p) - 1, len(p), KVCache(), append=len(p))
            for p in prompts
        ]
        ran: list[int] = []
        inner = step.forward_segment
        step.forward_segment = lambda s: ran.append(s.length) or inner(s)  # type: ignore[method-assign]
        out = step.forward_each(segs)
        del step.forward_segment
        assert ran == [5, 6, 9, 9]  # bucket 8 twice, then bucket 9
        for p, o in zip(prompts, out):
            alone = model.forward_segments(
                [Segment(torch.tensor(p), 0, len(p) - 1, len(p), KVCache(), append=len(p))]
            )[0]
            assert o is not None and torch.equal(o, alone)
    finally:
        attach_backend(model, "torch")
