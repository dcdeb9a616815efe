"""A row's greedy tokens never depend on the other rows of its pass, on the server's default runtime.

The shipped model (lossless verify) and its AR twin on ``--backend auto`` (openvino-bf16 here, the
exported step of every row): replies of suite prompts of mixed lengths (chat to tool calls, 12-230
tokens, and the turns of tool-calling conversations, which share their prefixes) decoded alone on a
fresh engine, then through one engine in batches of 2, 8 and 32 with requests joining while others
run and the prefix cache filling up, must be identical token for token.
"""

from __future__ import annotations

import pytest

import quicksilver
from quicksilver.assets import embedded_ar_model_path, embedded_model_path
from quicksilver.engine import Engine, EngineRequest
from quicksilver.suite.render import render
from quicksilver.suite.tasks import get_task

TASKS = ("chat", "multiply", "sudoku4", "countdown3", "path_star", "tool_call")


def _prompts(pipe) -> list[list[int]]:  # type: ignore[no-untyped-def]
    out = []
    for name in TASKS:
        for phrasing in ("templated", "held-out"):
            for item in get_task(name).test_items(3, phrasing=phrasing):
                out.append(render(item, pipe.tokenizer)[0])
    for item in get_task("tool_loop").test_items(2):
        msgs = item.messages or []
        for turn in (i for i, m in enumerate(msgs) if m["role"] == "assistant"):
            text = pipe.tokenizer.apply_chat_template(
                msgs[:turn], tools=item.tools, add_generation_prompt=True
            )
            out.append(pipe.tokenizer.encode(text))
    return out


def _replies(engine: Engine, pipe, prompts, every: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Greedy replies through ``engine``; a request joins every ``every`` steps (0: all at once)."""
    cfg = pipe.sampler_config(max_new_tokens=48, temperature=0.0)
    pending, out, step = list(enumerate(prompts)), {}, 0
    while pending or engine.has_work:
        while pending and (every == 0 or step % every == 0):
            i, ids = pending.pop(0)
            engine.add(EngineRequest(str(i), ids, cfg))
            if every:
                break
        for ev in engine.step():
            if ev.done:
                out[int(ev.request_id)] = ev.result.tokens
        step += 1
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize(
    "path",
    [embedded_model_path, pytest.param(embedded_ar_model_path, marks=pytest.mark.slow)],
    ids=["verify", "twin"],  # the twin's half in make test-slow (keeps make test near 4 minutes)
)
def test_greedy_replies_are_the_same_alone_and_in_any_batch(path) -> None:  # type: ignore[no-untyped-def]
    pipe = quicksilver.load(path(), backend="auto")
    if pipe.runtime_name == "torch":
        pytest.skip("no exported CPU step here (auto resolved to torch)")
    prompts = _prompts(pipe)
    assert len({len(p) for p in prompts}) > 10  # mixed lengths
    alone = [_replies(Engine(pipe.decoder), pipe, [p], 0)[0] for p in prompts]
    engine = Engine(pipe.decoder)  # one prefix cache for every run below
    for max_batch, every in ((2, 1), (8, 0), (8, 3), (32, 0), (32, 1)):
        engine.config.max_batch = max_batch
        got = _replies(engine, pipe, prompts, every)
        same = sum(a == b for a, b in zip(alone, got))
        assert same == len(prompts), f"batch {max_batch}, a request every {every} steps: {same}"
    if engine.prefix_cache is not None:
        assert engine.prefix_cache.hit_tokens > 0


@pytest.mark.slow  # eager FlexAttention is the CPU's unfused reference: ~0.1 s a layer call
def test_the_flex_layout_serves_the_same_replies_through_the_engine() -> None:
    """The shipped model on torch with the flex layout (the GPU default: the paged KV pool, one
    FlexAttention call per layer): replies through one engine, requests joining while others run
    and the prefix cache filling, equal the per-sequence SDPA path's replies alone."""
    ref = quicksilver.load(embedded_model_path(), backend="torch", attention_layout="per_sequence")
    pipe = quicksilver.load(embedded_model_path(), backend="torch", attention_layout="flex")
    prompts = _prompts(pipe)[::6]  # a few of every kind
    alone = [_replies(Engine(ref.decoder), ref, [p], 0)[0] for p in prompts]
    engine = Engine(pipe.decoder)
    for max_batch, every in ((4, 1), (8, 0)):
        engine.config.max_batch = max_batch
        assert _replies(engine, pipe, prompts, every) == alone
