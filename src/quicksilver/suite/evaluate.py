"""Held-out evaluation: decode each task's fixed test split and score it with the task's verifier.

Diffusion models are decoded by the fast ``Decoder``, causal models (the AR baseline, the drafting
network) by ``VerifyDecoder`` (greedy ``verify`` is their AR output; ``--draft 0`` one token per
pass), both in batches (rows are independent, so batching does not change answers). Per
task and stratum: accuracy, mean NFE per item, TPF (output tokens / forward passes), aggregate
tok/s of the batched run, and single-stream tok/s measured on the first few items at batch size 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError
from ..models.transformer import Transformer
from ..runtime import Runtime, as_runtime
from ..sampling import SamplerConfig
from ..sampling.decoders import decoder_for
from ..tokenizer import Tokenizer
from .render import prompt_text
from .tasks import Item, get_task, split_reply
from .tasks.tool_call import ToolCall


@dataclass
class ItemResult:
    item: Item
    reply: str
    correct: bool
    tokens: int
    nfe: int
    seconds: float


def stop_ids(model: Transformer, tokenizer: Tokenizer) -> list[int]:
    return sorted(set(model.config.eos_token_ids) | set(tokenizer.stop_ids))


@torch.no_grad()
def decode_items(
    model: Transformer | Runtime,
    tokenizer: Tokenizer,
    items: list[Item],
    cfg: SamplerConfig,
    instant: bool = False,
    batch_size: int = 32,
    cache: str = "auto",
    refresh_every: int = 0,
) -> list[ItemResult]:
    """Generate a reply for every item and verify it (a network alone on a torch runtime)."""
    runtime = as_runtime(model)
    was_training = runtime.net.training
    runtime.net.eval()
    stops = stop_ids(runtime.net, tokenizer)
    out: list[ItemResult] = []
    decoder = decoder_for(
        runtime,
        stops,
        pad_id=tokenizer.pad_id or 0,
        vocab_limit=tokenizer.vocab_size,
        cache_mode=cache,
        refresh_every=refresh_every,
    )
    for i in range(0, len(items), batch_size):
        chunk = items[i : i + batch_size]
        prompts = [tokenizer.encode(prompt_text(it, tokenizer, instant)) for it in chunk]
        room = [model.config.max_seq_len - len(p) for p in prompts]
        if min(room) <= 0:
            raise ConfigError(
                f"{chunk[0].task}: a prompt of {max(map(len, prompts))} tokens does not fit "
                f"the model's context of {model.config.max_seq_len}"
            )
        cfgs = [
            cfg.replace(max_new_tokens=min(get_task(it.task).max_answer_tokens + 8, r))
            for it, r in zip(chunk, room)
        ]
        t0 = time.perf_counter()
        results = decoder.generate(prompts, cfgs)
        dt = time.perf_counter() - t0
        for it, r in zip(chunk, results):
            text = tokenizer.decode(r.tokens)
            _, reply = split_reply(text)
            task = get_task(it.task)
            out.append(
                ItemResult(
                    it, text, bool(task.verify(it, reply)), len(r.tokens), r.nfe, dt / len(chunk)
                )
            )
    runtime.net.train(was_training)
    return out


def single_stream_tok_s(
    model: Transformer | Runtime,
    tokenizer: Tokenizer,
    items: list[Item],
    cfg: SamplerConfig,
    instant: bool = False,
    cache: str = "auto",
    refresh_every: int = 0,
) -> float:
    """Committed tokens per second of one request at a time (batch size 1), summed over items."""
    if not items:
        return 0.0
    res = decode_items(
        model,
        tokenizer,
        items,
        cfg,
        instant,
        batch_size=1,
        cache=cache,
        refresh_every=refresh_every,
    )
    secs = sum(r.seconds for r in res)
    return sum(r.tokens for r in res) / secs if secs > 0 else 0.0


def summarize(task_name: str, results: list[ItemResult]) -> dict[str, Any]:
    task = get_task(task_name)
    n = len(results)
    toks, nfe = sum(r.tokens for r in results), sum(r.nfe for r in results)
    secs = sum(r.seconds for r in results)
    strata: dict[str, dict[str, Any]] = {}
    for s in task.strata:
        rs = [r for r in results if r.item.stratum == s]
        if rs:
            strata[s] = {"accuracy": sum(r.correct for r in rs) / len(rs), "n": len(rs)}
    out: dict[str, Any] = {
        "accuracy": sum(r.correct for r in results) / max(n, 1),
        "n": n,
        "tpf": toks / max(nfe, 1),
        "nfe": nfe / max(n, 1),
        "tokens": toks / max(n, 1),
        "tok_s_batched": toks / secs if secs > 0 else 0.0,
        "strata": strata,
    }
    if task_name == "tool_call":
        calls = [r for r in results if r.item.stratum == "call"]
        if calls:
            out["parseable"] = sum(
                ToolCall.parseable(r.item, split_reply(r.reply)[1]) for r in calls
            ) / len(calls)
    return out


def evaluate(
    model: Transformer | Runtime,
    tokenizer: Tokenizer,
    tasks: list[str],
    limit: int,
    cfg: SamplerConfig,
    instant: bool = False,
    batch_size: int = 32,
    seed: int = 1234,
    stream_items: int = 0,
    examples: int = 0,
    cache: str = "auto",
    refresh_every: int = 0,
    phrasing: str = "templated",
) -> dict[str, Any]:
    """The --json shape: {"tasks": {name: {...}}, "settings": {...}}. ``phrasing`` picks the test
    split's wording: ``templated`` (canonical) or ``held-out`` (templates never trained on)."""
    report: dict[str, Any] = {"tasks": {}}
    for name in tasks:
        items = get_task(name).test_items(limit, seed, phrasing)
        res = decode_items(model, tokenizer, items, cfg, instant, batch_size, cache, refresh_every)
        rep = summarize(name, res)
        if stream_items:
            rep["tok_s"] = single_stream_tok_s(
                model, tokenizer, items[:stream_items], cfg, instant, cache, refresh_every
            )
        if examples:
            rep["examples"] = [{"reply": r.reply, "correct": r.correct} for r in res[:examples]]
        report["tasks"][name] = rep
    accs = [v["accuracy"] for v in report["tasks"].values()]
    report["mean_accuracy"] = sum(accs) / max(len(accs), 1)
    draft = model.config.draft_length if cfg.draft is None else cfg.draft
    decoding = (
        {
            "policy": cfg.policy,
            "draft": draft,
            "threshold": cfg.threshold,
            "temperature": cfg.temperature,
        }
        if model.config.attention == "causal"
        else {
            k: getattr(cfg, k)
            for k in (
                "policy",
                "threshold",
                "steps",
                "block_length",
                "window",
                "temperature",
                "revise_threshold",
                "max_revisions",
            )
        }
    )
    report["settings"] = {
        "decoding": decoding,
        "instant": instant,
        "limit": limit,
        "seed": seed,
        "batch_size": batch_size,
        "attention": model.config.attention,
        "threads": torch.get_num_threads(),
        "cache": cache,
        "refresh_every": refresh_every,
        "phrasing": phrasing,
    }
    return report
