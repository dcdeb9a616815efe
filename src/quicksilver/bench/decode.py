"""``quicksilver bench decode``: one-token-per-step vs threshold vs the reference decoder.

Same model, same prompts, one run: for each method the forward passes (NFE), tokens per forward
(TPF) and tok/s (median over prompts of the median over repeats). Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from ..cli_util import add_revision_arg
from ..pipeline import Pipeline, load
from ..sampling import SamplerConfig, reference_generate
from .common import bar_plot, emit_json, hardware, median, print_table

PROMPTS = [
    "Write a short greeting.",
    "What can you do?",
    "Find the path from 3 to 17 in the star graph.",
    "Solve the 4x4 sudoku.",
    "Multiply 123 by 45.",
    "Reach 24 with 3, 8 and 1.",
    "Call the weather tool for Paris.",
    "Say something kind.",
    "List three colours.",
    "Count from one to five.",
    "What is a diffusion language model?",
    "Summarise: the cat sat on the mat.",
]


def _reference_tokens(pipe: Pipeline, ids: list[int], n: int, block: int) -> tuple[list[int], int]:
    res = reference_generate(
        pipe.model, ids, pipe.config.mask_token_id, gen_length=n, steps=n, block_length=block
    )
    out = res.canvas
    # the reference fills the whole canvas; the answer ends at a stop token
    for i, t in enumerate(out):
        if t in pipe.stop_ids:
            out = out[:i]
            break
    return out, res.nfe


def run_decode_bench(model_path: Path, args: argparse.Namespace) -> int:
    pipe = load(model_path)
    n = args.max_tokens
    block = args.block_length or (
        pipe.config.block_size if pipe.config.attention == "block_causal" else 32
    )
    block = min(block, n)
    if n % block:
        n = (n // block) * block or block
    chat = pipe.tokenizer.chat_template is not None
    prompts = [pipe.encode_prompt(p, chat=chat) for p in (PROMPTS * 4)[: args.prompts]]
    methods: dict[str, Any] = {
        "one_token_per_step": SamplerConfig(
            max_new_tokens=n, policy="low_confidence", steps=n, block_length=block
        ),
        "threshold": SamplerConfig(
            max_new_tokens=n, policy="threshold", threshold=args.threshold, block_length=block
        ),
        "reference": None,
    }
    stats: dict[str, dict[str, list[float]]] = {
        m: {"tok_s": [], "nfe": [], "tpf": [], "tokens": []} for m in methods
    }
    pipe.decoder.generate([prompts[0]], SamplerConfig(max_new_tokens=min(8, n)))  # warm-up
    for ids in prompts:
        for name, cfg in methods.items():
            times, toks, nfe = [], 0, 0
            for _ in range(max(1, args.repeats)):
                t0 = time.perf_counter()
                if cfg is None:
                    out, nfe = _reference_tokens(pipe, ids, n, block)
                    toks = len(out)
                else:
                    r = pipe.decoder.generate([ids], cfg)[0]
                    toks, nfe = len(r.tokens), r.nfe
                times.append(time.perf_counter() - t0)
            dt = median(times)
            s = stats[name]
            s["tok_s"].append(toks / dt if dt > 0 else 0.0)
            s["nfe"].append(nfe)
            s["tpf"].append(toks / max(nfe, 1))
            s["tokens"].append(toks)
    summary = {m: {k: median(v) for k, v in s.items()} for m, s in stats.items()}
    ref = summary["reference"]["tok_s"] or float("nan")
    one = summary["one_token_per_step"]["tok_s"] or float("nan")
    rows = [
        [m, v["tokens"], v["nfe"], v["tpf"], v["tok_s"], v["tok_s"] / ref, v["tok_s"] / one]
        for m, v in summary.items()
    ]
    print_table(
        f"bench decode — {model_path} (canvas {n}, block {block}, {len(prompts)} prompts)",
        ["method", "tokens", "NFE", "TPF", "tok/s", "× reference", "× one/step"],
        rows,
    )
    png = bar_plot(
        Path(args.out) / "decode.png",
        list(summary),
        {k: [summary[m][k] for m in summary] for k in ("tok_s", "tpf", "nfe")},
        f"decode benchmark (canvas {n})",
    )
    emit_json(
        {
            "bench": "decode",
            "model": str(model_path),
            "canvas": n,
            "block_length": block,
            "threshold": args.threshold,
            "prompts": len(prompts),
            "repeats": args.repeats,
            "methods": summary,
            "ratio_threshold_vs_reference": summary["threshold"]["tok_s"] / ref,
            "ratio_threshold_vs_one_per_step": summary["threshold"]["tok_s"] / one,
            "plot": str(png),
            "hardware": hardware(),
            "torch_threads": torch.get_num_threads(),
        }
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``quicksilver bench decode``."""
    p.add_argument("--model", help="diffusion checkpoint (default: the embedded diffusion model)")
    add_revision_arg(p)
    p.add_argument("--max-tokens", type=int, default=64, dest="max_tokens")
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--block-length", type=int, default=None, dest="block_length")
    p.add_argument("--prompts", type=int, default=8, help="number of prompts")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats per prompt (median reported)"
    )
    p.add_argument(
        "--out", default="runs/bench_decode", help="directory for the table and PNG plot"
    )
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
