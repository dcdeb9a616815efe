"""GPU speed of the open diffusion LM shapes: LLaDA-8B, Dream-7B and DiffusionGemma-26B-A4B
(``bench/gemma_shape.py``) with RANDOM bf16 weights.

``quicksilver bench families`` / ``python -m quicksilver.bench.gpu_families``. For each shape (built
from the published config.json through the family loaders' config mapping, so the network is the
one a real checkpoint would get) it measures, at batch 1 and batch 8:

- ``block_fwd_per_s``: forward passes per second of one 32-token block against a KV cache of
  ``--context`` earlier positions (the decode step of a cached diffusion decoder);
- ``full_fwd_per_s``: forward passes per second over the whole context + block, no cache (what the
  reference LLaDA sampler runs every step);
- peak memory, and tok/s projected at the TPF values given by ``--tpf`` (committed tokens per
  forward; 1 = one token per step): per request = block_fwd_per_s x TPF, aggregate x batch.

With ``--tokens-per-step`` it also runs the real decoder (forward + batched selection + the one
event transfer per step) for every batch size at forced TPF k (``low_confidence``, steps = canvas /
k, no early stop) and at the default decoding (``threshold``), in each ``--layouts`` attention
layout (auto: flex over the paged KV pool on a GPU), with CUDA graphs off and, with
``--cuda-graphs``, on (``compile_static``, at ``--graph-batches``): ``decode`` rows give tok/s per
request and aggregate, ms per step, syncs per step and the peak memory of the row's runs.
``--quantize fp8`` runs the dense shapes' linears in e4m3 (runtime/fp8.py; refused on a device
without FP8 tensor cores, but for ``--tiny``).

The weights are random, so these are speeds of the network shape only — no quality, no real TPF.
For LLaDA and Dream (bidirectional) a KV cache is an approximation (Fast-dLLM's prefix cache); the
timing is the same either way. ``--tiny`` runs toy shapes on CPU in seconds (CI). Ends with one
line of JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..models.config import ModelConfig
from ..models.families.common import qwen_config
from ..models.families.llada import llada_config
from ..models.transformer import KVCache, Rotary, Transformer
from ..runtime import Runtime
from ..runtime.fp8 import fp8_unsupported, to_fp8
from ..runtime.packing import LAYOUTS, resolve_layout
from ..sampling import Decoder, SamplerConfig
from .common import calls_per_second, sync
from .gemma_shape import SHAPE as GEMMA_SHAPE
from .gemma_shape import bench_gemma
from .syncs import SyncCounter

# Published config.json files (GSAI-ML/LLaDA-8B-Instruct and Dream-org/Dream-v0-Instruct-7B on the Hugging Face Hub), the fields that shape the network.
LLADA_8B = {
    "architectures": ["LLaDAModelLM"],
    "block_type": "llama",
    "d_model": 4096,
    "n_heads": 32,
    "n_kv_heads": 32,
    "n_layers": 32,
    "mlp_hidden_size": 12288,
    "embedding_size": 126464,
    "vocab_size": 126464,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "max_sequence_length": 4096,
    "weight_tying": False,
    "mask_token_id": 126336,
    "eos_token_id": 126081,
    "pad_token_id": 126081,
}
DREAM_7B = {
    "architectures": ["DreamModel"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "mask_token_id": 151666,
    "eos_token_id": 151643,
    "pad_token_id": 151643,
}
TINY_OVERRIDES = {
    "llada-8b": {
        "d_model": 64,
        "n_heads": 4,
        "n_kv_heads": 4,
        "n_layers": 2,
        "mlp_hidden_size": 128,
        "embedding_size": 512,
        "vocab_size": 512,
        "mask_token_id": 500,
        "eos_token_id": 1,
        "pad_token_id": 1,
    },
    "dream-7b": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "mask_token_id": 500,
        "eos_token_id": 1,
        "pad_token_id": 1,
    },
}


def shape_config(name: str, tiny: bool) -> ModelConfig:
    where = Path(f"<{name} config.json>")
    if name == "llada-8b":
        return llada_config(where, {**LLADA_8B, **(TINY_OVERRIDES[name] if tiny else {})})
    cj = {**DREAM_7B, **(TINY_OVERRIDES[name] if tiny else {})}
    return qwen_config(
        where,
        cj,
        "Dream",
        qkv_bias=True,
        attention="bidirectional",
        logit_shift=True,
        max_seq_len=2048,
        mask_token_id=cj["mask_token_id"],
    )


def random_model(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> Transformer:
    """The network with random N(0, 0.02) weights made directly on the device (no CPU copy, no init cost)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta, cfg.max_seq_len).to(device)
    return model.to(dtype).eval()


@contextlib.contextmanager
def sync_debug(device: torch.device) -> Iterator[list[warnings.WarningMessage]]:
    """CUDA's own check (``torch.cuda.set_sync_debug_mode("warn")``) over a block: the warnings
    of every synchronizing call in it, recorded (none on the CPU)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # process peak RSS (Linux: KiB)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@torch.no_grad()
def bench_shape(
    name: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype
) -> dict[str, Any]:
    cfg = shape_config(name, args.tiny)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    model = random_model(cfg, device, dtype)
    params = model.num_params()
    if args.quantize == "fp8":  # on a CPU only for --tiny (the script's test): torch has the op
        why = fp8_unsupported(device)
        if why is not None and not args.tiny:
            return {"shape": name, "quantize": "fp8", "error": why}
        to_fp8(model)
    build_s = time.perf_counter() - t0
    rows = []
    for batch in args.batch:
        gen = torch.Generator(device="cpu").manual_seed(batch)
        # (B, P)
        ctx = torch.randint(0, cfg.vocab_size, (batch, args.context), generator=gen).to(device)
        # (B, 32)
        blk = torch.full((batch, args.block), cfg.mask_token_id, dtype=torch.long, device=device)
        cache = KVCache()
        model(ctx, cache=cache, append=True)  # prefill the context once
        block_rate = calls_per_second(
            partial(model, blk, cache=cache), device, args.iters, args.warmup
        )
        whole = torch.cat((ctx, blk), dim=1)  # (B, P + 32)
        full_rate = calls_per_second(partial(model, whole), device, max(1, args.iters // 2), 1)
        row = {
            "batch": batch,
            "context": args.context,
            "block": args.block,
            "block_fwd_per_s": round(block_rate, 2),
            "full_fwd_per_s": round(full_rate, 2),
            "cache_speedup": round(block_rate / full_rate, 2),
            "cache_bytes": cache.nbytes(),
            "projected_tok_s_per_request": {str(t): round(block_rate * t, 1) for t in args.tpf},
            "projected_tok_s_aggregate": {
                str(t): round(block_rate * t * batch, 1) for t in args.tpf
            },
        }
        rows.append(row)
        del cache
        print(
            f"{name:>9} batch {batch}: {block_rate:8.2f} block fwd/s (cache of {args.context}), "
            f"{full_rate:8.2f} full fwd/s, x{row['cache_speedup']} ; tok/s at TPF "
            + ", ".join(f"{t}: {block_rate * t:.0f}" for t in args.tpf),
            file=sys.stderr,
        )
    decode = bench_decodes(model, args, device) if args.tokens_per_step else []
    out = {
        "shape": name,
        "architecture": cfg.architecture,
        "parameters": params,
        "dtype": str(dtype),
        "quantize": args.quantize,
        "attention": cfg.attention,
        "logit_shift": cfg.logit_shift,
        "build_seconds": round(build_s, 2),
        "peak_memory_bytes": _peak_bytes(device),
        "rows": rows,
        "decode": decode,
    }
    del model
    return out


def bench_decodes(model: Transformer, args: argparse.Namespace, device: torch.device) -> list[Any]:
    """The decoder rows of every ``--layouts`` entry: eager, then (``--cuda-graphs``) static
    shapes + compiled per-token parts at the ``--graph-batches``. A failure (a capture, a kernel
    that does not compile, out of memory) is a row with an ``error``; the other rows stand."""
    rows: list[dict[str, Any]] = []
    for layout in args.layouts:
        runtime = Runtime(model, resolve_layout(layout, device))
        for graphs in (False, True) if args.cuda_graphs else (False,):
            batches = args.graph_batches or args.batch if graphs else args.batch
            try:
                if graphs:
                    runtime.compile_static()
                rows += bench_decode(runtime, args, device, graphs, batches)
            except Exception as e:  # a result too: the eager rows stand
                err = f"{type(e).__name__}: {e}"[:500]
                rows.append(
                    {"layout": runtime.attention_layout, "cuda_graphs": graphs, "error": err}
                )
    return rows


def decode_configs(args: argparse.Namespace) -> list[tuple[int | str, SamplerConfig]]:
    """Forced k tokens per step (``low_confidence``, steps = canvas / k, no early stop), then the
    default decoding (``threshold``: random weights rarely reach it, so about 1 a step)."""
    forced: list[tuple[int | str, SamplerConfig]] = [
        (
            k,
            SamplerConfig(
                max_new_tokens=args.gen,
                policy="low_confidence",
                steps=max(1, args.gen // k),
                block_length=args.decode_block,
                stop_at_eos=False,
            ),
        )
        for k in args.tokens_per_step
    ]
    default = SamplerConfig(
        max_new_tokens=args.gen, block_length=args.decode_block, stop_at_eos=False
    )
    return forced + [("default", default)]


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


@torch.no_grad()
def bench_decode(
    model: Runtime,
    args: argparse.Namespace,
    device: torch.device,
    graphs: bool,
    batches: list[int],
) -> list[dict[str, Any]]:
    """The real decoder at each ``decode_configs`` entry, for every batch size (random prompts)."""
    cfg = model.config
    dec = Decoder(model, cfg.mask_token_id, [], vocab_limit=cfg.vocab_size, cache_mode=args.cache)
    rows = []
    for batch in batches:
        gen = torch.Generator().manual_seed(batch)
        prompts = [
            torch.randint(3, cfg.mask_token_id, (args.context,), generator=gen).tolist()
            for _ in range(batch)
        ]
        for k, sc in decode_configs(args):
            _reset_peak(device)
            dec.generate(prompts, sc)  # warm-up (and graph capture)
            sync(device)
            t0 = time.perf_counter()
            res = dec.generate(prompts, sc)
            sync(device)
            dt = time.perf_counter() - t0
            rows.append(decode_row(dec, prompts, sc, res, dt, device) | {"tokens_per_step": k})
            rows[-1] |= {"layout": model.attention_layout, "cuda_graphs": graphs, "batch": batch}
            print(
                f"  decode {model.attention_layout} graphs={'on' if graphs else 'off'} batch "
                f"{batch} k={k}: {rows[-1]['tok_s_per_request']:8.1f} tok/s per request, "
                f"{rows[-1]['ms_per_step']:.2f} ms/step",
                file=sys.stderr,
            )
    return rows


def decode_row(
    dec: Decoder,
    prompts: list[list[int]],
    sc: SamplerConfig,
    res: list[Any],
    dt: float,
    device: torch.device,
) -> dict[str, Any]:
    """One decoder row's figures; the host syncs and uploads counted on a fresh batch's first step."""
    fresh = [dec.new_row(p, sc) for p in prompts]
    with SyncCounter() as syncs, sync_debug(device) as flagged:
        dec.step(fresh)
    for r in fresh:
        if r.cache is not None:
            r.cache.release()
    tokens = sum(len(r.tokens) for r in res)
    nfe = max(r.nfe for r in res)
    return {
        "tpf": round(res[0].tpf, 2),
        "tok_s_per_request": round(tokens / len(res) / dt, 1),
        "tok_s_aggregate": round(tokens / dt, 1),
        "ms_per_step": round(dt / nfe * 1e3, 3),
        "syncs_per_step": syncs.total,
        "uploads_per_step": syncs.uploads,
        "blocking_uploads_per_step": syncs.blocking_uploads,
        "sync_debug_warnings": len(flagged),
        "peak_memory_bytes": _peak_bytes(device),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The shapes and the timed forwards, then the decoder runs' flags."""
    p.add_argument(
        "--tiny",
        action="store_true",
        help="toy shapes (CPU, seconds): checks the script, not the speed",
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        default=["llada-8b", "dream-7b"],
        choices=["llada-8b", "dream-7b", GEMMA_SHAPE],
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"{GEMMA_SHAPE}: keep the first N layers at the real widths (the CPU slice)",
    )
    p.add_argument(
        "--canvases",
        type=int,
        default=2,
        help=f"{GEMMA_SHAPE}: canvases of the timed generation loop",
    )
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    p.add_argument(
        "--context", type=int, default=512, help="cached positions before the block (prompt + done)"
    )
    p.add_argument("--block", type=int, default=32, help="block length decoded per forward")
    p.add_argument("--iters", type=int, default=20, help="timed forwards per measurement")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument(
        "--tpf",
        nargs="+",
        type=float,
        default=[1.0, 2.0, 3.0],
        help="tokens per forward to project tok/s at (1 = one token per step)",
    )
    add_decoder_arguments(p)


def add_decoder_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the real decoder's runs: tokens per step, canvas, cache, layouts, graphs,
    weights, device."""
    p.add_argument(
        "--tokens-per-step",
        dest="tokens_per_step",
        nargs="*",
        type=int,
        default=[],
        help="also run the real decoder at these forced tokens per step (e.g. 1 2 5 8)",
    )
    p.add_argument(
        "--gen",
        type=int,
        default=120,
        help="canvas length of the decoder runs (a multiple of --decode-block)",
    )
    p.add_argument(
        "--decode-block",
        dest="decode_block",
        type=int,
        default=40,
        help="block of the decoder runs: a multiple of every --tokens-per-step, so TPF is exact",
    )
    p.add_argument(
        "--cache", default="dual", help="decoder cache mode (dual: Fast-dLLM's, bidirectional)"
    )
    p.add_argument(
        "--layouts",
        nargs="+",
        default=["auto"],
        choices=["auto", *LAYOUTS],
        help="attention layouts of the decoder runs (auto: flex on a GPU, per_sequence on a CPU)",
    )
    p.add_argument(
        "--graph-batches",
        dest="graph_batches",
        nargs="*",
        type=int,
        default=[],
        help="batch sizes of the --cuda-graphs runs (default: every --batch)",
    )
    p.add_argument(
        "--quantize",
        default="none",
        choices=["none", "fp8"],
        help="fp8: the dense shapes' linears in e4m3 with per-channel scales (runtime/fp8.py)",
    )
    p.add_argument(
        "--cuda-graphs",
        dest="cuda_graphs",
        action="store_true",
        help="decoder runs also with static shapes + torch.compile(mode='reduce-overhead')",
    )
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["bfloat16", "float16", "float32"],
        help="default: bfloat16 on GPU, float32 on CPU",
    )
    p.add_argument("--out", default=None, help="also write the JSON result to this file")


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    if args.tiny:
        args.context, args.iters = min(args.context, 64), min(args.iters, 3)
    hw = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine()
    )
    print(
        f"quicksilver bench families: RANDOM weights ({'tiny toy shapes' if args.tiny else 'real shapes'}) "
        f"on {device.type} ({hw}), {dtype}",
        file=sys.stderr,
    )
    results = [
        bench_gemma(args, device, dtype)
        if s == GEMMA_SHAPE
        else bench_shape(s, args, device, dtype)
        for s in args.shapes
    ]
    summary = {
        "bench": "families",
        "weights": "random",
        "tiny": args.tiny,
        "device": device.type,
        "hardware": hw,
        "torch": torch.__version__,
        "note": "speed of the network shape only: random weights, so no quality and no measured TPF; "
        "tok/s are projections at the given TPF",
        "results": results,
    }
    line = json.dumps(summary)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m quicksilver.bench.gpu_families", description=__doc__.split("\n")[0]
    )
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
