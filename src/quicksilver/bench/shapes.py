"""``quicksilver bench shapes``: what one decode step costs on this CPU at the published shapes of the
families we serve, with RANDOM weights (speed of the network shape only: no quality, no real TPF).

Shapes (the fields of the published config.json that shape the network, mapped through the family
loaders' config functions): Fast-dLLM v2 1.5B (Qwen2.5-1.5B body: hidden 1536, 28 layers, 12 heads /
2 KV heads, MLP 8960, vocabulary 151,936, tied embeddings, q/k/v bias), SDAR 1.7B (Qwen3-1.7B body:
hidden 2048, 28 layers, 16 / 8 heads of 128, MLP 6144, QK-norm, tied) and a 4-layer slice of
LLaDA-8B (hidden 4096, 32 heads, MLP 12288, vocabulary 126,464; the slice keeps the embedding and
head, so per-layer cost x 32 + head gives the whole model); and LLaDA2-mini (16B total, 1.4B active:
bench/moe_shapes.py), in int4 / int8 only (weight-only linears in torch, built tensor by tensor),
whole or as ``llada2-mini-slice`` (its first 4 layers: the dense one and 3 MoE layers; per MoE layer
cost x 19 + the rest gives the whole model). Sources: the Qwen2.5-1.5B / Qwen3-1.7B
configs as published (e.g. web-llm's qwen2 1.5B model_config; THUDM slime's qwen3-1.7B model
arguments), LLaDA-8B from its published config.json (GSAI-ML/LLaDA-8B-Instruct).

For each shape and weight format (float32, bfloat16, the graph's bf16 / int8 / int4; int8 / int4
weight-only linears for MoE shapes) it prefills a realistic prompt
into an exact KV cache, then times, against that cache:

- one AR token step: 1 position through the network (what an AR decoder pays per token);
- one diffusion step over a window of w positions (w = 1, 4, 8, 16, 32): the positions a step
  recomputes, the rest of the block served from the cache;
- tok/s at forced commit rates: k tokens committed per step of the default window (k = 1..8);
- the verify pass at k = 4 and 8 (sampling/decoders/verify.py): 1 + k tokens on the stream and k masks,
  1 + 2k positions; and the 1 + k positions of a pass without masks behind its drafts (or of the
  bonus and k masks after a rejection), which the CPU's mask gate makes most passes; with
  ``--verify-tpf`` (tokens per pass measured by ``bench speed``'s verify on our model: one figure
  for every k, or ``4:2.9,8:3.3``) the projected verify tok/s over AR = tpf / (1 + 2k pass / AR
  token), the conservative bound (every pass the wide one); with ``--verify-wide`` too (``bench
  speed``'s ``wide_pass_fraction``: the share of passes after the first that fed drafts with k
  masks behind them, ~0.2 under the CPU's mask gate in torch, 0 on an exported step, where every
  decode pass is 1 + k positions) also under that mix of wide and 1 + k passes. Random weights have
  no acceptance of their own, so the projection borrows the measured one.

Ends with one JSON line whose top level holds ``step_vs_ar_token``: the default window's step over
an AR token step at the 1.5B shape in the default CPU dtype for its size (``default_dtype``:
bfloat16 from 0.5B parameters).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..figures import save_figure
from ..models.checkpoint import default_dtype, dtype_name
from ..models.config import ModelConfig
from ..models.families.common import qwen_config
from ..models.families.llada import llada_config
from ..models.kvcache import KVCache
from ..models.meta import meta_build
from ..models.transformer import Transformer
from ..runtime import Runtime, Segment
from ..runtime.ov_graph import Weights, attach_graph
from ..runtime.quantize import moe_runtime
from .common import (
    current_rss_bytes,
    emit_json,
    hardware,
    peak_rss_bytes,
    print_table,
    time_ms,
)
from .gpu_families import LLADA_8B, TINY_OVERRIDES, random_model
from .llama_diffusion import DIFFUSION_SHAPES, LlamaDiffusionPeer, diffusion_thesis, plot_peer
from .llama_shapes import PEER_TYPES, llama_bench, quantize_gguf, write_gguf
from .moe_shapes import DrawnState, llada2_shape_config

QWEN25_1_5B = {
    "architectures": ["Fast_dLLM_QwenForCausalLM"],
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "eos_token_id": 151645,
    "pad_token_id": 151645,
}
QWEN3_1_7B = {
    "architectures": ["SDARForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "eos_token_id": 151645,
    "pad_token_id": 151645,
}
LLADA_SLICE_LAYERS = 4
DENSE_SHAPES = ("fast-dllm-v2-1.5b", "sdar-1.7b", "llada-8b-slice")
SHAPES = (*DENSE_SHAPES, "llada2-mini", "llada2-mini-slice")
MOE_SLICE_LAYERS = 4  # llada2-mini-slice: the dense layer and 3 MoE layers, embedding and head
# torch eager in float32 / bfloat16; the step graph on OpenVINO with bf16, int8 or int4 weights
FORMATS = ("float32", "bfloat16", "graph-bf16", "int8", "int4")
GRAPH = {"graph-bf16": "bf16", "int8": "int8", "int4": "int4"}  # bench format -> graph format
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512}
TINY_QWEN = {**TINY, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def shape_config(name: str, tiny: bool) -> ModelConfig:
    """The ModelConfig a real checkpoint of ``name`` would get (``tiny``: toy sizes for tests)."""
    where = Path(f"<{name} config.json>")
    cj: dict[str, Any]
    if name in ("llada2-mini", "llada2-mini-slice"):
        return llada2_shape_config(tiny, MOE_SLICE_LAYERS if name.endswith("slice") else None)
    if name == "llada-8b-slice":
        cj = {
            **LLADA_8B,
            "n_layers": LLADA_SLICE_LAYERS,
            **(TINY_OVERRIDES["llada-8b"] if tiny else {}),
        }
        return llada_config(where, cj)
    if name == "fast-dllm-v2-1.5b":
        cj = {**QWEN25_1_5B, **(TINY_QWEN if tiny else {})}
        fixed: dict[str, Any] = dict(qkv_bias=True, block_size=32, logit_shift=True)
    elif name == "sdar-1.7b":
        cj = {**QWEN3_1_7B, **(TINY_QWEN if tiny else {})}
        fixed = dict(qk_norm=True, block_size=32)
    else:
        raise ConfigError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    mask = cj["vocab_size"] - 1
    return qwen_config(
        where, cj, name, attention="block_causal", max_seq_len=4096, mask_token_id=mask, **fixed
    )


def random_weights(cfg: ModelConfig, seed: int = 0) -> Weights:
    """The network's tensors drawn one at a time as the graph asks for them (N(0, 0.02), norms
    1, biases 0; no whole network in memory): what a checkpoint read lazily gives the graph."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}

    def draw(name: str) -> torch.Tensor:
        if name.endswith("norm.weight"):
            return torch.ones(shapes[name])
        if name.endswith(".bias"):
            return torch.zeros(shapes[name])
        gen = torch.Generator().manual_seed(seed + sum(map(ord, name)) * 7919 + len(name))
        return torch.randn(shapes[name], generator=gen, dtype=torch.bfloat16) * 0.02

    return draw


def build(cfg: ModelConfig, fmt: str) -> Runtime:
    """A random-weight network in one weight format on its runtime: torch eager (float32,
    bfloat16), or the step graph alone (graph-bf16, int8, int4; no torch weights behind it); a
    mixture of experts in torch with weight-only int8 / int4 linears (no float copy either)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if cfg.moe is not None:  # weight-only linears in torch (runtime/weight_only.py)
        if fmt not in ("int8", "int4"):
            raise ConfigError(f"mixture-of-experts shapes run int8 or int4, not {fmt!r}")
        with meta_build():
            names = list(Transformer(cfg).state_dict())
        return moe_runtime(cfg, DrawnState(names, random_weights(cfg)), fmt)
    if fmt in GRAPH:
        with torch.device("meta"):
            runtime = Runtime(Transformer(cfg))
        attach_graph(runtime, GRAPH[fmt], weights=random_weights(cfg))
        return runtime
    dtype = torch.bfloat16 if fmt == "bfloat16" else torch.float32
    return Runtime(random_model(cfg, torch.device("cpu"), dtype))


def default_format(n_params: int) -> str:
    """The format ``quicksilver.load`` computes a CPU model of this size in by default."""
    return dtype_name(default_dtype(n_params, torch.device("cpu")))


VERIFY_KS = (4, 8)


def headline_row(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The 1.5B shape's figures in its default CPU format (None when it was not run)."""
    shape = next((s for s in results if s["shape"] == "fast-dllm-v2-1.5b"), None)
    if shape is None:
        return None
    fmt = default_format(shape["parameters"])
    return next((r for r in shape["formats"] if r["format"] == fmt), None)


def headline_ratio(results: list[dict[str, Any]], window: int) -> tuple[float | None, str | None]:
    """The 1.5B shape's step / AR token at ``window`` in its default CPU format, and that format
    (None, None when the shape was not run)."""
    row = headline_row(results)
    return (None, None) if row is None else (row["step_vs_ar_token"][str(window)], row["format"])


@torch.no_grad()
def bench_format(cfg: ModelConfig, fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    """One shape in one format: prefill, then the AR token step and every window's step."""
    t0 = time.perf_counter()
    runtime = build(cfg, fmt)
    build_s = time.perf_counter() - t0
    rss_built = current_rss_bytes()
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (args.context,), generator=gen)  # (P,)
    cache = KVCache()
    t0 = time.perf_counter()
    P = args.context
    runtime.forward_segments([Segment(prompt, 0, P - 1, P, cache, append=P)])  # the prompt's cache
    prefill_ms = (time.perf_counter() - t0) * 1e3

    def step(w: int) -> Any:
        ids = torch.full((w,), cfg.mask_token_id, dtype=torch.long)  # (w,)
        seg = Segment(ids, P, 0, w, cache, append=0)  # nothing committed: the prompt's cache
        return lambda: runtime.forward_segments([seg])

    ar_ms = time_ms(step(1), args.iters)
    windows = {str(w): round(time_ms(step(w), args.iters), 3) for w in args.windows}
    verify = {str(k): round(time_ms(step(1 + 2 * k), args.iters), 3) for k in VERIFY_KS}
    lean = {str(k): round(time_ms(step(1 + k), args.iters), 3) for k in VERIFY_KS}
    default_ms = windows[str(args.window)]
    rates = {str(k): round(1e3 * k / default_ms, 2) for k in range(1, min(8, args.window) + 1)}
    out = {
        "format": fmt,
        "build_seconds": round(build_s, 1),
        "prefill_ms": round(prefill_ms, 1),
        "ar_token_ms": round(ar_ms, 3),
        "ar_tok_s": round(1e3 / ar_ms, 2),
        "step_ms": windows,
        "step_vs_ar_token": {w: round(ms / ar_ms, 3) for w, ms in windows.items()},
        "tok_s_at_k": rates,
        "verify_pass_ms": verify,
        "verify_vs_ar_token": {k: round(ms / ar_ms, 3) for k, ms in verify.items()},
        "verify_lean_ms": {k: round(ms, 3) for k, ms in lean.items()},
        "verify_lean_vs_ar_token": {k: round(ms / ar_ms, 3) for k, ms in lean.items()},
        "cache_bytes": cache.nbytes(),
        "rss_after_build_bytes": rss_built,
    }
    tpf, f = args.verify_tpf, args.verify_wide
    if tpf:
        out["verify_projected_vs_ar"] = {
            k: round(tpf[k] / (ms / ar_ms), 2) for k, ms in verify.items() if k in tpf
        }
    if tpf and f is not None:
        out["verify_projected_gated_vs_ar"] = {
            k: round(tpf[k] * ar_ms / (f * ms + (1 - f) * lean[k]), 2)
            for k, ms in verify.items()
            if k in tpf
        }
    return out


def fraction(text: str) -> float:
    """``--verify-wide``: a share in [0, 1]."""
    try:
        f = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= f <= 1.0:
        raise argparse.ArgumentTypeError("a fraction in [0, 1]")
    return f


def verify_tpf(text: str) -> dict[str, float]:
    """``--verify-tpf``: one tokens-per-pass figure for every k, or ``k:tpf`` pairs."""
    try:
        if ":" not in text:
            return {str(k): float(text) for k in VERIFY_KS}
        pairs = (part.split(":") for part in text.split(",") if part.strip())
        out = {str(int(k)): float(t) for k, t in pairs}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or k:tpf pairs: {text!r}") from None
    if not all(t > 0 for t in out.values()):
        raise argparse.ArgumentTypeError("tokens per pass must be positive")
    return out


def plot(results: list[dict[str, Any]], windows: list[int], path: Path) -> Path:
    """Left: a step's ms by positions (solid: ours, w = 1 the AR token; dashed: llama.cpp's batch
    of the same size in the same format, its AR token at 1). Right: tok/s at k tokens committed a
    step (dotted: our AR; dashed: llama.cpp's AR in that format)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for shape in results:
        for r in shape["formats"]:
            label = f"{shape['shape']} {r['format']}"
            line = axes[0].plot(windows, [r["step_ms"][str(w)] for w in windows], "o-", label=label)
            color = line[0].get_color()
            ks = [int(k) for k in r["tok_s_at_k"]]
            axes[1].plot(ks, list(r["tok_s_at_k"].values()), "o-", color=color, label=label)
            axes[1].axhline(r["ar_tok_s"], color=color, ls=":", lw=1)
            peer = r.get("llama_cpp")
            if peer:
                ws = [1, *(int(w) for w in peer["step_ms"])]
                ms = [peer["ar_token_ms"], *peer["step_ms"].values()]
                axes[0].plot(ws, ms, "s--", color=color, label=f"llama.cpp {peer['type']}")
                axes[1].axhline(1e3 / peer["ar_token_ms"], color=color, ls="--", lw=1)
            if "llama_diffusion" in r:
                plot_peer(axes[0], r["llama_diffusion"], color)
    axes[0].set(xlabel="positions per step", ylabel="ms per step", xscale="log", yscale="log")
    axes[0].set_xticks(windows, [str(w) for w in windows])
    axes[1].set(
        xlabel="tokens committed per step (k)", ylabel="tok/s (dotted: AR; dashed: llama.cpp AR)"
    )
    axes[0].legend(fontsize=6)
    fig.suptitle(
        "random weights, one CPU step: quicksilver (solid), llama.cpp (dashed; stars: "
        "llama-diffusion-cli's whole-canvas step)"
    )
    return save_figure(fig, path)


PEER_SHAPES = ("fast-dllm-v2-1.5b", "sdar-1.7b")  # the AR bodies llama.cpp runs


class LlamaPeer:
    """llama.cpp on the same shape: one bf16 GGUF of the same random weights, quantized per
    format on first use, timed by llama-bench at the same depth, windows and threads."""

    key = "llama_cpp"  # where a format's row keeps its figures

    def __init__(self, cfg: ModelConfig, args: argparse.Namespace) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="qs-shape-gguf-")
        self.args, self.files = args, {}
        self.files["BF16"] = write_gguf(cfg, random_weights(cfg), Path(self.dir.name) / "bf16.gguf")

    def bench(self, kind: str, ours: dict[str, Any]) -> dict[str, Any]:
        """llama-bench of this shape in ``kind``, and our row's ratios to it."""
        if kind not in self.files:
            out = Path(self.dir.name) / f"{kind.lower()}.gguf"
            self.files[kind] = quantize_gguf(self.files["BF16"], kind, out)
        a = self.args
        windows = [w for w in a.windows if w > 1]
        got = llama_bench(self.files[kind], windows, a.context, a.threads or 1, a.llama_reps)
        got["type"] = kind
        got["ar_ours_vs_theirs"] = round(ours["ar_token_ms"] / got["ar_token_ms"], 3)
        got["step_ours_vs_theirs"] = {
            w: round(ours["step_ms"][w] / ms, 3)
            for w, ms in got["step_ms"].items()
            if w in ours["step_ms"]
        }
        return got

    def close(self) -> None:
        self.dir.cleanup()


def llama_peer(
    name: str, cfg: ModelConfig, args: argparse.Namespace
) -> LlamaPeer | LlamaDiffusionPeer | None:
    """llama.cpp beside this shape under --vs-llama-cpp: llama-bench for the AR bodies,
    llama-diffusion-cli for LLaDA (None: not asked, or no peer for the shape)."""
    if not args.vs_llama_cpp:
        return None
    if name in PEER_SHAPES:
        return LlamaPeer(cfg, args)
    if name in DIFFUSION_SHAPES:
        return LlamaDiffusionPeer(cfg, random_weights(cfg), args)
    return None


def thesis(results: list[dict[str, Any]], window: int) -> dict[str, Any]:
    """Per shape beside llama.cpp: our best 4-bit AR token over its Q4_0 token, the verify pass
    (1 + 8 positions) and the window step over our AR token, and k = 4 forced tokens per window
    step in tok/s over llama.cpp's Q4_0 AR tok/s (the parallel step's case at a real size)."""
    out: dict[str, Any] = {}
    for shape in results:
        row = next(
            (r for r in shape["formats"] if r["format"] == "int4" and "llama_cpp" in r), None
        )
        if row is None:
            continue
        peer = row["llama_cpp"]
        out[shape["shape"]] = {
            "ar_int4_vs_llama_q4_0": peer["ar_ours_vs_theirs"],
            "verify_9_vs_ar": round(row["verify_lean_ms"]["8"] / row["ar_token_ms"], 3),
            f"window_{window}_vs_ar": row["step_vs_ar_token"][str(window)],
            f"forced_4_per_{window}_step_vs_llama_q4_0_ar": round(
                row["tok_s_at_k"]["4"] * peer["ar_token_ms"] / 1e3, 3
            ),
        }
    return out


def run(args: argparse.Namespace) -> int:
    if args.window not in args.windows:
        raise ConfigError(f"--window {args.window} must be one of --windows {args.windows}")
    if not 1 <= args.context <= 2048 or not 1 <= args.iters <= 50:
        raise ConfigError("--context must be in [1, 2048] and --iters in [1, 50]")
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [s for s in args.shapes.split(",") if s]
    formats = [f for f in args.formats.split(",") if f]
    results = []
    for name in shapes:
        cfg = shape_config(name, args.tiny)
        peer = llama_peer(name, cfg, args)
        rows = []
        for fmt in formats:  # ours, then llama.cpp's same format: interleaved format by format
            rows.append(bench_format(cfg, fmt, args))
            gc.collect()  # the last format's weights go before the next are built
            if peer is not None and fmt in PEER_TYPES:
                rows[-1][peer.key] = peer.bench(PEER_TYPES[fmt], rows[-1])
        if peer is not None:
            peer.close()
        for r in rows:
            print(
                f"{name} {r['format']}: AR token {r['ar_token_ms']:.1f} ms, steps "
                + ", ".join(f"w{w} {ms:.1f}" for w, ms in r["step_ms"].items()),
                file=sys.stderr,
            )
        with torch.device("meta"):
            params = Transformer(cfg).num_params()
        results.append({"shape": name, "parameters": params, "formats": rows})
    print_table(
        f"one step vs one AR token step (random weights, context {args.context})",
        ["config", "AR ms", *[f"w{w}/AR" for w in args.windows], f"tok/s k=8 (w{args.window})"],
        [
            [f"{s['shape']} {r['format']}", r["ar_token_ms"]]
            + [r["step_vs_ar_token"][str(w)] for w in args.windows]
            + [r["tok_s_at_k"].get(str(min(8, args.window)), float("nan"))]
            for s in results
            for r in s["formats"]
        ],
    )
    png = plot(results, args.windows, Path(args.out) / "shapes.png")
    headline, headline_format = headline_ratio(results, args.window)
    emit_json(
        {
            "bench": "shapes",
            "vs_llama_cpp": (
                thesis(results, args.window) | diffusion_thesis(results)
                if args.vs_llama_cpp
                else None
            ),
            "random_weights": True,
            "step_vs_ar_token": headline,
            "verify_vs_ar_token": (headline_row(results) or {}).get("verify_vs_ar_token"),
            "verify_projected_vs_ar": (headline_row(results) or {}).get("verify_projected_vs_ar"),
            "headline_format": headline_format,
            "window": args.window,
            "context": args.context,
            "shapes": results,
            "peak_rss_bytes": peak_rss_bytes(),
            "tiny": args.tiny,
            "plot": str(png),
            "hardware": hardware(),
            "date": datetime.date.today().isoformat(),
        }
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shapes",
        default=",".join(DENSE_SHAPES),
        help=f"comma-separated: {', '.join(SHAPES)} (llada2-mini: --formats int4,int8 only)",
    )
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated weight formats")
    p.add_argument("--windows", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    p.add_argument(
        "--window", type=int, default=8, help="the default window (headline, tok/s at k)"
    )
    p.add_argument("--context", type=int, default=256, help="prompt positions in the KV cache")
    p.add_argument("--iters", type=int, default=3, help="timed calls per measurement (median)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: the default)")
    p.add_argument(
        "--verify-tpf",
        type=verify_tpf,
        default={},
        dest="verify_tpf",
        help="tokens per verify pass measured on our model (bench speed), one figure or "
        "k:tpf pairs (4:2.9,8:3.3): projects verify tok/s",
    )
    p.add_argument(
        "--verify-wide",
        type=fraction,
        default=None,
        dest="verify_wide",
        help="bench speed's wide_pass_fraction: projects verify under that mix of 1 + 2k and 1 + k passes",
    )
    p.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        dest="vs_llama_cpp",
        help="llama.cpp beside each format: the same random weights as GGUF, llama-quantize "
        "(Q8_0, Q4_0), llama-bench on the Qwen-shaped bodies, llama-diffusion-cli on the LLaDA "
        "slice (its whole canvas a step; ours the largest window on the cache); make "
        "llama-server builds them",
    )
    p.add_argument(
        "--llama-reps",
        type=int,
        default=3,
        dest="llama_reps",
        help="llama-bench -r; llama-diffusion-cli runs",
    )
    p.add_argument("--tiny", action="store_true", help="toy sizes (tests; seconds)")
    p.add_argument("--out", default="runs/bench_shapes", help="directory for the PNG plot")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
