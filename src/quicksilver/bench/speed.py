"""``quicksilver bench speed``: parallel refinement vs autoregressive decoding, side by side.

On the same machine, the same held-out task items and one run, single stream (one request at a
time): (a) the equal-size AR baseline with a KV cache, (b) the reference decoder (LLaDA
``generate.py`` semantics: no cache, one forward per step, steps = canvas length), (c) diffusion with
one token per step (with the caches), (d) quicksilver's default (threshold decoding + caches). Per
method: tok/s (committed output tokens per second from arrival to last token; median over items of
the median over repeats), ``tok_s_aggregate`` (all items' tokens over the sum of their median
times: long replies weigh as much as they take, and it moves less from run to run), TPF, NFE, ms
per forward pass (wall time / NFE, prefill included), TTFT and accuracy by the task verifiers;
ratios to (a) and (b); a PNG; the last line is JSON whose top level (``tok_s``, ``tpf``,
``ratio_vs_ar``, ``aggregate_ratio_vs_ar``, ``step_vs_ar_token``: ms per forward ÷ the AR
baseline's) describes what ``quicksilver serve`` decodes with, named by ``headline``: ``verify`` on
the embedded causal model, or (d) when no drafting model runs; (d)'s and ``verify``'s own ratios
sit in their entries under ``methods``. With ``--vs-llama-cpp`` the AR twin also
runs in llama.cpp (bench/llama_cpp.py) on the same token ids — through its Python binding and, once
``make llama-server`` has built it, its own C++ server, plain and with its own prompt-lookup
speculation (``llama_server_ngram``: bench/llama_cpp.py ``NGRAM_FLAGS``) — and the top level gains
``ratio_vs_llama_cpp``, ``ratio_vs_llama_server``, ``ratio_vs_llama_server_ngram`` and
``ratio_vs_llama_cpp_best`` (against the fastest of them).
``--backend`` picks the step runtime of both models (default auto: ONNX Runtime on a CPU, see
runtime/cpu_backends.py) and ``--window`` the default's decode window; both are in ``settings``.
``--interleave`` runs each item's repeats round-robin over the methods (A B C A B C, the order turning
with every repeat) instead of each method's repeats back to back (A A A B B B), so a slow spell of a
shared VM lands on every method alike: the A/B statistic for models that differ by a few percent.

Verify decoding (sampling/decoders/verify.py) of a causal drafting model (``--verify-model``, default: the
embedded model when it is one) runs beside them: ``verify`` (k = ``--draft``, default the model's)
``verify_no_copy`` (the same without copy drafts: sampling/decoders/copy_drafts.py) and ``verify_ar`` (the
same weights, ``draft = 0``: one token per pass), with ``identical_to_ar``
(the fraction of items whose verify output equals the ``draft = 0`` output, and for each item that
differs the top-2 logit gap at the first difference) and the histogram of drafts kept per pass;
``--draft-sweep 2,4,8`` adds ``verify_k2`` ... and a plot of tok/s against k. When ``--model`` is
itself causal, the diffusion methods (reference, one token per step, default) are left out.
"""

from __future__ import annotations

import argparse
import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..assets import embedded_ar_model_path, embedded_diffusion_model_path, embedded_model_path
from ..cli_util import add_load_args, dataclass_from_args
from ..engine import Engine, EngineConfig, EngineRequest
from ..errors import QuicksilverError
from ..models.checkpoint import dtype_name
from ..pipeline import DTYPE_CHOICES, LoadConfig, Pipeline, load
from ..sampling import SamplerConfig, reference_generate
from ..sampling.core.caches import resolve_window
from ..sampling.decoders.autoregressive import ar_stream
from ..suite.render import prompt_text
from ..suite.tasks import Item, get_task, split_reply
from .common import bar_plot, emit_json, hardware, median, print_table
from .llama_cpp import (
    NGRAM_FLAGS,
    LlamaCppRunner,
    LlamaServerRunner,
    binding_installed,
    server_has_ngram,
)
from .peers import llama_server_built
from .verify import identity, verify_configs, verify_entry, verify_pipeline

DEFAULT_TASKS = "chat,tool_call,sudoku4,countdown3,path_star,multiply"
PLOT_TITLE = "single stream: the same items and prompt tokens for every method"


@dataclass
class Run:
    tokens: list[int]
    nfe: int
    seconds: float
    ttft: float
    accepted: list[int] = field(default_factory=list)  # verify: drafts kept per verifying pass
    wide_passes: int = 0  # verify: passes that fed drafts with k masks behind them


@dataclass
class MethodStats:
    tok_s: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # per item, the median over repeats
    decode_tok_s: list[float] = field(default_factory=list)  # after the first token (no prefill)
    tpf: list[float] = field(default_factory=list)
    nfe: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    ms_per_forward: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    task: list[str] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    wide_passes: list[int] = field(default_factory=list)

    def _verify_summary(self) -> dict[str, Any]:
        """A drafting method's acceptance: drafts kept per pass, and the share of the passes after
        each first one that fed drafts with k masks behind them."""
        later = max(sum(self.nfe) - len(self.nfe), 1)
        return {
            "accepted_hist": histogram(self.accepted),
            "wide_pass_fraction": sum(self.wide_passes) / later,
        }

    def summary(self) -> dict[str, Any]:
        per_task = {
            t: sum(c for c, tt in zip(self.correct, self.task) if tt == t) / self.task.count(t)
            for t in dict.fromkeys(self.task)
        }
        return {
            "tok_s": median(self.tok_s),
            "tok_s_aggregate": sum(self.tokens) / sum(self.seconds) if sum(self.seconds) else 0.0,
            "decode_tok_s": median(self.decode_tok_s),
            "tpf": median(self.tpf),
            "nfe": median(self.nfe),
            "ttft_ms": 1000 * median(self.ttft),
            "tokens": median(self.tokens),
            "ms_per_forward": median(self.ms_per_forward),
            "accuracy": sum(self.correct) / max(len(self.correct), 1),
            "task_accuracy": per_task,
            **(self._verify_summary() if self.accepted else {}),
        }


def histogram(values: list[int]) -> list[int]:
    """counts[a] = how many times a drafts were kept in one pass."""
    counts = [0] * (max(values) + 1)
    for v in values:
        counts[v] += 1
    return counts


def run_order(names: list[str], item: int, repeats: int, interleave: bool) -> list[tuple[str, int]]:
    """(method, repeat) in the order item ``item`` times them. The methods' order turns with each
    item, so none always runs first on caches another model left cold (the same configuration timed
    first and fourth differed by 5%); interleaved, it also turns with each repeat."""
    turn = item % len(names)
    order = names[turn:] + names[:turn]
    if not interleave:
        return [(name, r) for name in order for r in range(repeats)]
    return [
        (name, r)
        for r in range(repeats)
        for name in order[r % len(order) :] + order[: r % len(order)]
    ]


def engine_run(pipe: Pipeline, ids: list[int], cfg: SamplerConfig) -> Run:
    eng: Engine[Any] = Engine(pipe.decoder, EngineConfig(prefix_cache_mb=0))
    eng.add(EngineRequest("bench", ids, cfg))
    final = None
    for ev in eng.run_until_idle():
        if ev.done:
            final = ev
    assert final is not None and final.result is not None
    st = final.stats
    return Run(
        final.result.tokens,
        final.result.nfe,
        (st.e2e or 0.0),
        st.ttft if st.ttft is not None else st.e2e or 0.0,
        list(final.result.accepted or []),
        final.result.wide_passes,
    )


def ar_run(pipe: Pipeline, ids: list[int], n: int) -> Run:
    t0 = time.perf_counter()
    ttft = None
    gen = ar_stream(pipe.runtime, ids, n, pipe.stop_ids)
    while True:
        try:
            next(gen)
            if ttft is None:
                ttft = time.perf_counter() - t0
        except StopIteration as stop:
            res = stop.value
            break
    dt = time.perf_counter() - t0
    return Run(res.tokens, res.nfe, dt, ttft if ttft is not None else dt)


def reference_run(pipe: Pipeline, ids: list[int], n: int, block: int) -> Run:
    n = max(block, (n + block - 1) // block * block)
    t0 = time.perf_counter()
    res = reference_generate(
        pipe.model, ids, pipe.config.mask_token_id, gen_length=n, steps=n, block_length=block
    )
    dt = time.perf_counter() - t0
    out = res.canvas
    # the answer ends at the first stop token; nothing is streamed before the end
    for i, t in enumerate(out):
        if t in pipe.stop_ids:
            out = out[:i]
            break
    return Run(out, res.nfe, dt, dt)


ONE_PER_STEP = {"default": "one_token_per_step", "verify": "verify_ar"}


def ratios(summary: dict[str, dict[str, Any]], m: str) -> dict[str, float]:
    """Method ``m`` against the others of the run: the AR twin (by the median item, in aggregate
    and per forward pass), the reference decoder, llama.cpp where it ran, and the accuracy it
    gains over the same model committing one token per pass."""
    v, ar = summary[m], summary["ar_kv_cache"]
    nan = {"tok_s": float("nan")}
    out = {
        "ratio_vs_ar": v["tok_s"] / ar["tok_s"],
        "aggregate_ratio_vs_ar": v["tok_s_aggregate"] / ar["tok_s_aggregate"],
        "step_vs_ar_token": v["ms_per_forward"] / ar["ms_per_forward"],
        "ratio_vs_reference": v["tok_s"] / (summary.get("reference", nan)["tok_s"] or math.nan),
        "accuracy_vs_one_per_step": v["accuracy"] - summary.get(ONE_PER_STEP[m], v)["accuracy"],
    }
    peers = [summary[m]["tok_s"] for m in LLAMA_METHODS.values() if m in summary]
    for key, method in LLAMA_METHODS.items():
        if method in summary:
            out[f"ratio_vs_{key}"] = v["tok_s"] / summary[method]["tok_s"]
    if peers:  # against whichever of llama.cpp's ways ran fastest
        out["ratio_vs_llama_cpp_best"] = v["tok_s"] / max(peers)
    return out


# llama.cpp's methods by the ratio key each gives
LLAMA_METHODS = {
    "llama_cpp": "llama_cpp_ar",
    "llama_server": "llama_server_ar",
    "llama_server_ngram": "llama_server_ngram",
}


def verify_method(
    v: Pipeline, cfg: SamplerConfig
) -> Callable[[Pipeline, Pipeline, list[int], int], Run]:
    """A method that decodes on the drafting model ``v`` with ``cfg`` (the others' models unused)."""
    return lambda p, a, ids, n: engine_run(v, ids, cfg.replace(max_new_tokens=n))


Method = Callable[[Pipeline, Pipeline, list[int], int], Run]


@dataclass
class Models:
    """What one ``bench speed`` run loads: the diffusion model, its AR twin and the drafting model."""

    model_path: Path
    ar_path: Path
    lcfg: LoadConfig
    pipe: Pipeline
    ar: Pipeline
    vpipe: Pipeline | None


@dataclass
class Peers:
    """llama.cpp's ways of running the AR twin, where ``--vs-llama-cpp`` started them."""

    llama: LlamaCppRunner | None = None
    server: LlamaServerRunner | None = None
    ngram: LlamaServerRunner | None = None


def load_models(args: argparse.Namespace) -> Models:
    model_path = Path(args.model) if args.model else embedded_diffusion_model_path()
    ar_path = Path(args.ar_model) if args.ar_model else embedded_ar_model_path()
    if model_path is None:
        raise QuicksilverError("no --model given and no embedded model is installed")
    if ar_path is None:
        raise QuicksilverError("no --ar-model given and no embedded AR baseline is installed")
    torch.manual_seed(0)
    lcfg = dataclass_from_args(LoadConfig, args)
    pipe = load(model_path, lcfg)
    ar_dtype = getattr(args, "ar_dtype", None) or lcfg.dtype
    # --revision: --model's
    ar = load(ar_path, lcfg, dtype=ar_dtype, revision=None)
    if ar.config.attention != "causal":
        raise QuicksilverError(f"{ar_path} is not a causal (AR) model")
    given = getattr(args, "verify_model", None)
    vpath = Path(given) if given else embedded_model_path()
    vpipe = verify_pipeline(vpath, bool(given), pipe, lcfg)
    return Models(model_path, ar_path, lcfg, pipe, ar, vpipe)


def decoding_methods(
    args: argparse.Namespace, m: Models, block: int, default: SamplerConfig
) -> dict[str, Method]:
    """The AR twin, the diffusion methods (a diffusion model only) and the verify methods."""
    methods: dict[str, Method] = {
        "ar_kv_cache": lambda p, a, ids, n: ar_run(a, ids, n),
    }
    if m.pipe.config.attention != "causal":
        methods |= {
            "reference": lambda p, a, ids, n: reference_run(p, ids, n, block),
            "one_token_per_step": lambda p, a, ids, n: engine_run(
                p, ids, SamplerConfig(max_new_tokens=n, policy="low_confidence", steps=n)
            ),
            "default": lambda p, a, ids, n: engine_run(p, ids, default.replace(max_new_tokens=n)),
        }
    if args.skip_reference:
        methods.pop("reference", None)
    sweep = [int(k) for k in (getattr(args, "draft_sweep", None) or "").split(",") if k.strip()]
    if m.vpipe is not None:
        for name, vcfg in verify_configs(getattr(args, "draft", None), sweep).items():
            methods[name] = verify_method(m.vpipe, vcfg)
    return methods


def llama_methods(args: argparse.Namespace, m: Models, methods: dict[str, Method]) -> Peers:
    """Add llama.cpp's methods under ``--vs-llama-cpp``: its binding and, once built, its server."""
    peers = Peers()
    if not getattr(args, "vs_llama_cpp", False):
        return peers
    if binding_installed() or not llama_server_built():
        llama = LlamaCppRunner(
            m.ar_path, torch.get_num_threads(), args.llama_cpp_dtype, m.ar.config.max_seq_len
        )
        methods["llama_cpp_ar"] = lambda p, a, ids, n: Run(*llama.run(ids, n, a.stop_ids))
        peers.llama = llama
    # llama.cpp's own C++ loop, beside or instead of the binding
    if llama_server_built():
        server = LlamaServerRunner(m.ar_path, args.llama_cpp_dtype)
        methods["llama_server_ar"] = lambda p, a, ids, n: Run(*server.run(ids, n, a.stop_ids))
        peers.server = server
        # and its own prompt-lookup speculation
        if server_has_ngram(server.binary):
            ngram = LlamaServerRunner(m.ar_path, args.llama_cpp_dtype, NGRAM_FLAGS)
            methods["llama_server_ngram"] = lambda p, a, ids, n: Run(*ngram.run(ids, n, a.stop_ids))
            peers.ngram = ngram
    return peers


def record(s: MethodStats, runs: list[Run], correct: bool, task: str, ids: list[int]) -> None:
    """One item's repeats of one method into its statistics (times: the median over repeats)."""
    r = runs[0]
    secs = median([x.seconds for x in runs])
    s.tok_s.append(len(r.tokens) / secs if secs > 0 else 0.0)
    s.seconds.append(secs)
    ttft = median([x.ttft for x in runs])
    # a method that streams (not the reference)
    if len(r.tokens) > 1 and secs > ttft:
        s.decode_tok_s.append((len(r.tokens) - 1) / (secs - ttft))
    s.tpf.append(len(r.tokens) / max(r.nfe, 1))
    s.ms_per_forward.append(1000 * secs / max(r.nfe, 1))
    s.nfe.append(r.nfe)
    s.ttft.append(ttft)
    s.tokens.append(len(r.tokens))
    s.correct.append(correct)
    s.task.append(task)
    s.outputs.append(r.tokens)
    s.accepted += r.accepted
    s.wide_passes.append(r.wide_passes)
    s.prompts.append(ids)


def measure(
    args: argparse.Namespace, m: Models, methods: dict[str, Method], items: list[Item]
) -> dict[str, MethodStats]:
    """A warm-up per method, then every item through every method, in ``run_order``."""
    pipe, ar, tok = m.pipe, m.ar, m.pipe.tokenizer
    stats = {name: MethodStats() for name in methods}
    warm = items[0]
    # warm-up
    for fn in methods.values():
        fn(pipe, ar, tok.encode(prompt_text(warm, tok, False)), 16)
    names = list(methods)
    repeats, interleave = max(1, args.repeats), bool(getattr(args, "interleave", False))
    for i, it in enumerate(items):
        task = get_task(it.task)
        ids = tok.encode(prompt_text(it, tok, False))
        n = min(task.max_answer_tokens + 8, pipe.config.max_seq_len - len(ids))
        timed: dict[str, list[Run]] = {name: [] for name in names}
        for name, _ in run_order(names, i, repeats, interleave):
            timed[name].append(methods[name](pipe, ar, ids, n))
        for name, runs in timed.items():
            reply = split_reply(tok.decode(runs[0].tokens))[1]
            record(stats[name], runs, bool(task.verify(it, reply)), it.task, ids)
    return stats


def report(summary: dict[str, dict[str, Any]], title: str, out: Path) -> Path:
    """The table on stdout and the PNG of tok/s, TPF and accuracy per method."""
    ar_tok_s = summary["ar_kv_cache"]["tok_s"]
    ref_tok_s = summary["reference"]["tok_s"] if "reference" in summary else float("nan")
    rows = [
        [
            name,
            v["accuracy"],
            v["tok_s"],
            v["tpf"],
            v["nfe"],
            v["ttft_ms"],
            v["tok_s"] / ar_tok_s,
            v["tok_s"] / ref_tok_s,
        ]
        for name, v in summary.items()
    ]
    print_table(
        title,
        ["method", "accuracy", "tok/s", "TPF", "NFE", "TTFT ms", "× AR", "× reference"],
        rows,
    )
    return bar_plot(
        out / "speed.png",
        list(summary),
        {
            "tok/s (median)": [v["tok_s"] for v in summary.values()],
            "tokens per forward": [v["tpf"] for v in summary.values()],
            "accuracy": [v["accuracy"] for v in summary.values()],
        },
        PLOT_TITLE,
    )


def peer_extra(d: dict[str, Any], peers: Peers) -> dict[str, Any]:
    """The headline's ratios to llama.cpp's ways and their facts; closes its servers."""
    extra: dict[str, Any] = {}
    if peers.llama is not None:
        extra = {"ratio_vs_llama_cpp": d["ratio_vs_llama_cpp"], "llama_cpp": peers.llama.info()}
    if peers.server is not None:
        peers.server.close()
        extra["ratio_vs_llama_server"] = d["ratio_vs_llama_server"]
        extra["llama_server"] = peers.server.info()
    if peers.ngram is not None:
        peers.ngram.close()
        extra["ratio_vs_llama_server_ngram"] = d["ratio_vs_llama_server_ngram"]
        extra["llama_server_ngram"] = peers.ngram.info()
    # against the fastest of llama.cpp's ways
    if "ratio_vs_llama_cpp_best" in d:
        extra["ratio_vs_llama_cpp_best"] = d["ratio_vs_llama_cpp_best"]
    return extra


def settings(m: Models, default: SamplerConfig, block: int, window: int) -> dict[str, Any]:
    """The decoding and load settings every method ran under."""
    return {
        "policy": default.policy,
        "threshold": default.threshold,
        "block": block,
        "window": window or None,
        "dtype": dtype_name(m.pipe.model.model.embed_tokens.weight.dtype),
        "ar_dtype": dtype_name(m.ar.model.model.embed_tokens.weight.dtype),
        "compile": m.lcfg.compile,
        "quantize": m.lcfg.quantize,
        "backend": m.pipe.runtime_name,
        "ar_backend": m.ar.runtime_name,
    }


def run_speed_bench(args: argparse.Namespace) -> int:
    m = load_models(args)
    pipe, vpipe = m.pipe, m.vpipe
    block = pipe.config.block_size if pipe.config.attention == "block_causal" else 32
    tasks = [t for t in args.tasks.split(",") if t]
    items = [it for name in tasks for it in get_task(name).test_items(args.limit, args.seed)]
    default = SamplerConfig(threshold=args.threshold, window=getattr(args, "window", None))
    window = resolve_window(
        default.window,
        block if pipe.config.attention == "block_causal" else None,
        pipe.decoder.resolve_cache_mode(),
        pipe.decoder.device.type,
    )
    methods = decoding_methods(args, m, block, default)
    peers = llama_methods(args, m, methods)
    stats = measure(args, m, methods, items)
    summary = {name: s.summary() for name, s in stats.items()}
    if vpipe is not None:
        ar_out = stats["verify_ar"].outputs
        for name in [n for n in summary if n.startswith("verify") and n != "verify_ar"]:
            summary[name] |= identity(vpipe.model, stats[name].prompts, stats[name].outputs, ar_out)
    # what `quicksilver serve` decodes with
    head = "verify" if vpipe is not None else "default"
    d = summary[head]
    title = (
        f"bench speed — {len(items)} items ({','.join(tasks)}), single stream, "
        f"{torch.get_num_threads()} threads"
    )
    out = Path(args.out)
    png = report(summary, title, out)
    ar_ms = summary["ar_kv_cache"]["ms_per_forward"]
    # each decoding method's ratios, under its own entry
    for name in ("default", "verify"):
        if name in summary:
            summary[name] |= ratios(summary, name)
    extra = peer_extra(d, peers)
    if vpipe is not None:
        extra["verify"] = verify_entry(
            summary, vpipe, args.draft, out, [*LLAMA_METHODS, "llama_cpp_best"]
        )
    emit_json(
        {
            "bench": "speed",
            "headline": head,
            "tok_s": d["tok_s"],
            "tpf": d["tpf"],
            "accuracy": d["accuracy"],
            "ratio_vs_ar": d["ratio_vs_ar"],
            "aggregate_ratio_vs_ar": d["aggregate_ratio_vs_ar"],
            "step_vs_ar_token": d["step_vs_ar_token"],
            "ar_ms_per_token": ar_ms,
            **extra,
            "ratio_vs_reference": d["ratio_vs_reference"],
            "accuracy_vs_one_per_step": d["accuracy_vs_one_per_step"],
            "methods": summary,
            "model": str(m.model_path),
            "ar_model": str(m.ar_path),
            "tasks": tasks,
            "items": len(items),
            "repeats": args.repeats,
            "interleave": bool(getattr(args, "interleave", False)),
            "settings": settings(m, default, block, window),
            "plot": str(png),
            "hardware": hardware(),
            "date": datetime.date.today().isoformat(),
        }
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``quicksilver bench speed``."""
    p.add_argument("--model", help="diffusion checkpoint (default: the embedded diffusion model)")
    p.add_argument(
        "--ar-model",
        dest="ar_model",
        help="equal-size AR checkpoint (default: the embedded baseline)",
    )
    p.add_argument(
        "--tasks", default=DEFAULT_TASKS, help=f"comma-separated tasks (default: {DEFAULT_TASKS})"
    )
    p.add_argument("--limit", type=int, default=8, help="held-out items per task")
    p.add_argument("--seed", type=int, default=1234, help="test-split seed")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per item (median)")
    p.add_argument(
        "--interleave",
        action="store_true",
        help="time each item's repeats round-robin over the methods (A B A B), not back to back",
    )
    p.add_argument(
        "--threshold", type=float, default=0.9, help="threshold of the default configuration"
    )
    add_load_args(p)  # every model the bench loads (--dtype: the one timed against the AR baseline)
    p.add_argument(
        "--ar-dtype",
        dest="ar_dtype",
        choices=DTYPE_CHOICES,
        help="compute dtype of the AR baseline (default: --dtype); on AMX CPUs bf16 speeds up "
        "32-token blocks but slows 1-token AR steps, so each can run at its best",
    )
    p.add_argument(
        "--window",
        type=int,
        help="decode window of the default configuration (default: the device's, see README)",
    )
    p.add_argument(
        "--skip-reference",
        action="store_true",
        dest="skip_reference",
        help="leave out the slow reference decoder",
    )
    p.add_argument(
        "--vs-llama-cpp",
        action="store_true",
        dest="vs_llama_cpp",
        help="also time the AR twin in llama.cpp (exported to GGUF): its Python binding (`make "
        "test-llama-cpp`) and its C++ server (`make llama-server`), whichever are built",
    )
    p.add_argument(
        "--llama-cpp-dtype",
        default="f32",
        choices=["f32", "f16", "bf16"],
        dest="llama_cpp_dtype",
        help="weight type of the GGUF llama.cpp runs",
    )
    p.add_argument(
        "--verify-model",
        dest="verify_model",
        help="causal drafting checkpoint timed under verify decoding (default: the embedded model "
        "when it is one)",
    )
    p.add_argument("--draft", type=int, help="drafts per pass of verify (default: the model's)")
    p.add_argument(
        "--draft-sweep",
        dest="draft_sweep",
        help="comma-separated k values timed as verify_kK, plotted as tok/s against k",
    )
    p.add_argument("--out", default="runs/bench_speed", help="directory for the PNG plot")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
