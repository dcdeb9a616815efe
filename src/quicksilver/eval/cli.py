"""``quicksilver eval --model PATH --tasks ... --limit N --json [--sweep]``: per task and stratum the
held-out accuracy (by the task's verifier), NFE, TPF and tok/s; ``--sweep`` runs a grid of decoding
settings (threshold, steps, policy) and writes a table and an accuracy-vs-TPF PNG; ``--curves`` plots
learning curves of finished runs. Always ends with one line of JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..assets import resolve_model
from ..cli_util import MODEL_HELP, add_dataclass_args, add_load_args, dataclass_from_args
from ..errors import ConfigError
from ..pipeline import LoadConfig, Pipeline, load
from ..sampling.core.config import SamplerConfig
from ..suite.evaluate import evaluate
from ..suite.tasks.phrasing import PHRASINGS
from ..train.likelihood import heldout_loss
from .gsm8k import PRESETS
from .gsm8k import run as run_gsm8k
from .served import served_edits, served_tool_calls

DEFAULT_TASKS = "path_star,sudoku4,countdown3,multiply,tool_call,chat,fim"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    e = sub.add_parser("eval", help="held-out accuracy, NFE, TPF and tok/s on the task suite")
    add_item_args(e)
    add_gsm8k_args(e)
    add_output_args(e)
    add_dataclass_args(
        e,
        SamplerConfig,
        rename={"max_new_tokens": "max-tokens"},
        skip={"record_canvas", "max_new_tokens", "seed", "stop_at_eos"},
    )


def add_item_args(e: argparse.ArgumentParser) -> None:
    """What is evaluated: the model, the tasks or benchmark, the items and how they are decoded."""
    e.add_argument("--model", help=MODEL_HELP + " (default: the embedded model)")
    e.add_argument(
        "--tasks", default=DEFAULT_TASKS, help=f"comma-separated tasks (default: {DEFAULT_TASKS})"
    )
    e.add_argument(
        "--benchmark",
        default="suite",
        choices=["suite", "gsm8k"],
        help="suite: quicksilver's task suite (default); gsm8k: your GSM8K JSONL (--data) with "
        "published settings (--preset)",
    )
    e.add_argument(
        "--limit", type=int, default=None, help="held-out items per task (default: 200; gsm8k: all)"
    )
    e.add_argument("--seed", type=int, default=1234, help="seed of the fixed test split")
    e.add_argument(
        "--compare",
        help="also evaluate this checkpoint on the same items (ar: the embedded AR twin); both are "
        "reported side by side",
    )
    e.add_argument(
        "--phrasing",
        default="templated",
        choices=PHRASINGS,
        help="test-split wording: templated (canonical) or held-out (phrasing templates, notations "
        "and argument names never seen in training; same puzzles)",
    )
    e.add_argument(
        "--instant", action="store_true", help="no reasoning: pre-fill an empty <think></think>"
    )
    e.add_argument(
        "--batch-size",
        type=int,
        default=None,
        dest="batch_size",
        help="rows decoded together (default: 32; gsm8k: 1)",
    )


def add_gsm8k_args(e: argparse.ArgumentParser) -> None:
    """``--benchmark gsm8k``'s own flags."""
    e.add_argument(
        "--data", help="gsm8k: a GSM8K-format JSONL (question, answer ending in '#### N'); yours"
    )
    e.add_argument(
        "--preset",
        default="llada",
        choices=sorted(PRESETS),
        help="gsm8k: published decoding settings",
    )
    e.add_argument(
        "--num-fewshot", type=int, default=None, dest="num_fewshot", help="gsm8k: few-shot examples"
    )
    e.add_argument(
        "--fewshot-data",
        default=None,
        dest="fewshot_data",
        help="gsm8k: JSONL of few-shot examples",
    )
    e.add_argument(
        "--records", default=None, help="gsm8k: write one JSON line per item to this file"
    )


def add_output_args(e: argparse.ArgumentParser) -> None:
    """What is reported besides accuracy, the load flags, and the sweep and curves modes."""
    e.add_argument(
        "--stream-items",
        type=int,
        default=8,
        dest="stream_items",
        help="items per task timed at batch size 1 for single-stream tok/s (0: skip)",
    )
    e.add_argument(
        "--examples", type=int, default=0, help="include this many replies per task in the JSON"
    )
    e.add_argument("--json", action="store_true", help="print only the JSON line")
    # packed rows always run in torch: an exported --backend wants --batch-size 1
    add_load_args(e)
    e.add_argument(
        "--loss",
        action="store_true",
        help="also report the held-out loss (fixed items and noise; comparable across checkpoints)",
    )
    e.add_argument(
        "--sweep", action="store_true", help="grid over threshold, steps and policy; table + PNG"
    )
    e.add_argument("--out", default="runs/eval", help="directory for sweep tables and plots")
    e.add_argument(
        "--curves", help="plot learning curves: LABEL=RUN_DIR,... (metrics.jsonl eval records)"
    )
    e.add_argument(
        "--tool-choice",
        dest="tool_choice",
        choices=["auto", "required"],
        help="also score tool_call's call turns through the server's own path with this tool_choice "
        "(required: schema-constrained canvas); reported under tasks.tool_call.served",
    )
    e.add_argument(
        "--routes",
        action="store_true",
        help="score the edit tasks (--tasks among apply_edit, next_edit and their _made_up twins) "
        "through /v1/apply/completions and /v1/edit/completions on the app `make run` serves "
        "(the edit model answers; --model replaces the default's checkpoint); greedy",
    )


def print_table(rep: dict[str, Any]) -> None:
    print(f"{'task':<12}{'acc':>7}{'TPF':>7}{'NFE':>7}{'tok/s':>8}  strata")
    for name, r in rep["tasks"].items():
        strata = " ".join(f"{k}={v['accuracy']:.2f}" for k, v in r["strata"].items())
        extra = f" parseable={r['parseable']:.2f}" if "parseable" in r else ""
        print(
            f"{name:<12}{r['accuracy']:>7.3f}{r['tpf']:>7.2f}{r['nfe']:>7.1f}{r.get('tok_s', 0):>8.0f}  {strata}{extra}"
        )
        if "served" in r:
            sv = r["served"]
            print(
                f"{'':<12}served, tool_choice={sv['tool_choice']}: call turns {sv['accuracy']:.3f} "
                f"(parseable {sv['parseable']:.2f}, n={sv['n']}, failed requests {sv['failed']})"
            )
    loss = f"; held-out loss {rep['heldout_loss']:.4f}" if "heldout_loss" in rep else ""
    print(f"mean accuracy {rep['mean_accuracy']:.3f}{loss}; settings {json.dumps(rep['settings'])}")
    if "compare" in rep:
        print_side_by_side(rep, rep["compare"])


def print_side_by_side(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Accuracy and TPF of two models on the same items, task by task."""
    na, nb = Path(a["settings"]["model"]).name, Path(b["settings"]["model"]).name
    print(f"\n{'task':<12}{na[:16]:>17}{'TPF':>7}{nb[:16]:>17}{'TPF':>7}")
    for name, r in a["tasks"].items():
        o = b["tasks"][name]
        print(
            f"{name:<12}{r['accuracy']:>17.3f}{r['tpf']:>7.2f}{o['accuracy']:>17.3f}{o['tpf']:>7.2f}"
        )
    print(f"{'mean':<12}{a['mean_accuracy']:>17.3f}{'':>7}{b['mean_accuracy']:>17.3f}")


def sweep_grid() -> list[tuple[str, str, dict[str, Any]]]:
    """(group, short label, sampler overrides) for --sweep."""
    grid: list[tuple[str, str, dict[str, Any]]] = []
    for th in (0.5, 0.7, 0.9, 0.99):
        grid.append(("threshold", f"t={th}", {"policy": "threshold", "threshold": th}))
    for pol in ("low_confidence", "margin", "entropy", "random"):
        for steps in (16, 64):
            grid.append((pol, f"s={steps}", {"policy": pol, "steps": steps}))
    grid.append(
        (
            "threshold+revision",
            "t=0.9,r=0.3",
            {"policy": "threshold", "threshold": 0.9, "revise_threshold": 0.3},
        )
    )
    return grid


def handle(args: argparse.Namespace) -> int:
    if args.curves:
        return plot_curves(args)
    if args.benchmark == "gsm8k":
        return gsm8k(args)
    args.limit = 200 if args.limit is None else args.limit
    args.batch_size = args.batch_size or 32

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if args.limit <= 0:
        raise ConfigError("--limit must be positive")
    if args.routes:
        return routes(args, tasks)
    lcfg = dataclass_from_args(LoadConfig, args)
    pipe = load(resolve_model(args.model, revision=args.revision), lcfg)
    names = set(SamplerConfig.__dataclass_fields__)
    base = SamplerConfig(**{k: v for k, v in vars(args).items() if k in names and v is not None})
    if not args.sweep:
        return suite(args, pipe, lcfg, base, tasks)
    if pipe.config.attention == "causal":
        raise ConfigError(
            "--sweep varies diffusion decoding settings; an AR model has none to sweep"
        )
    return sweep(args, pipe, lcfg, base, tasks)


def routes(args: argparse.Namespace, tasks: list[str]) -> int:
    """The edit tasks through their routes (eval/served.py): one JSON line."""
    rep = served_edits(tasks, args.limit, args.seed, args.phrasing, checkpoint=args.model)
    for name, r in rep.items():
        if not args.json:
            print(
                f"{name:<20} exact {r['accuracy']:.3f}  TPF {r['tpf']:.2f}  "
                f"{r['tok_s_median']:.0f} tok/s  ({r['model']}, {r['n']} items)"
            )
    print(json.dumps({"routes": rep, "phrasing": args.phrasing, "limit": args.limit}))
    return 0


def plot_curves(args: argparse.Namespace) -> int:
    """``--curves``: learning curves of finished runs."""
    from .plots import plot_learning_curves  # lazy: matplotlib loads only to plot

    runs = dict(part.split("=", 1) for part in args.curves.split(","))
    path = plot_learning_curves(runs, Path(args.out) / "learning_curve.png")
    print(json.dumps({"plot": str(path)}))
    return 0


def gsm8k(args: argparse.Namespace) -> int:
    """``--benchmark gsm8k``: the user's GSM8K file under published settings."""
    if not args.data:
        raise ConfigError("--benchmark gsm8k needs --data FILE.jsonl (nothing is downloaded)")
    if args.limit is not None and args.limit <= 0:
        raise ConfigError("--limit must be positive")
    args.batch_size = args.batch_size or 1
    path = resolve_model(args.model, revision=args.revision)
    pipe = load(path, dataclass_from_args(LoadConfig, args))
    names = set(SamplerConfig.__dataclass_fields__)
    over = {k: v for k, v in vars(args).items() if k in names and v is not None}
    return run_gsm8k(pipe, args, **over)


def evaluate_one(
    args: argparse.Namespace,
    p: Pipeline,
    lcfg: LoadConfig,
    base: SamplerConfig,
    tasks: list[str],
) -> dict[str, Any]:
    """One model's report on the suite's items, with what ran in its settings."""
    # a causal drafting model decodes under its own default (verify)
    cfg = base
    if args.policy is None and p.config.attention == "causal":
        cfg = base.replace(policy=p.generation_defaults.get("policy", "verify"))
    rep = evaluate(
        p.runtime,
        p.tokenizer,
        tasks,
        args.limit,
        cfg,
        args.instant,
        args.batch_size,
        args.seed,
        args.stream_items,
        args.examples,
        lcfg.cache,
        lcfg.refresh_every,
        args.phrasing,
    )
    rep["settings"]["model"] = str(p.path)
    rep["settings"]["quantize"] = lcfg.quantize
    # what ran: --backend resolved
    rep["settings"]["backend"] = p.runtime_name
    return rep


def suite(
    args: argparse.Namespace,
    pipe: Pipeline,
    lcfg: LoadConfig,
    base: SamplerConfig,
    tasks: list[str],
) -> int:
    """The task suite at one setting: the report (and ``--compare``'s beside it), the served
    tool calls and the held-out loss where asked."""
    rep = evaluate_one(args, pipe, lcfg, base, tasks)
    if args.compare:
        other = resolve_model(None if args.compare == "ar" else args.compare, ar=True)
        rep["compare"] = evaluate_one(args, load(other, lcfg), lcfg, base, tasks)
    if args.tool_choice and "tool_call" in rep["tasks"]:
        rep["tasks"]["tool_call"]["served"] = served_tool_calls(
            resolve_model(args.model, revision=args.revision),
            args.tool_choice,
            args.limit,
            args.seed,
            base.threshold,
            args.phrasing,
        )
    if args.loss:
        rep["heldout_loss"] = heldout_loss(pipe.model, pipe.tokenizer, tasks, n=16, repeats=2)
    if not args.json:
        print_table(rep)
    print(json.dumps(rep))
    return 0


def sweep_row(
    args: argparse.Namespace,
    pipe: Pipeline,
    lcfg: LoadConfig,
    cfg: SamplerConfig,
    tasks: list[str],
) -> dict[str, Any]:
    """One setting of the sweep: its mean accuracy, TPF and per-task accuracy."""
    rep = evaluate(
        pipe.runtime,
        pipe.tokenizer,
        tasks,
        args.limit,
        cfg,
        args.instant,
        args.batch_size,
        args.seed,
        cache=lcfg.cache,
        refresh_every=lcfg.refresh_every,
        phrasing=args.phrasing,
    )
    toks = sum(r["tokens"] * r["n"] for r in rep["tasks"].values())
    nfe = sum(r["nfe"] * r["n"] for r in rep["tasks"].values())
    return {
        "accuracy": rep["mean_accuracy"],
        "tpf": toks / max(nfe, 1),
        "tasks": {k: v["accuracy"] for k, v in rep["tasks"].items()},
    }


def sweep(
    args: argparse.Namespace,
    pipe: Pipeline,
    lcfg: LoadConfig,
    base: SamplerConfig,
    tasks: list[str],
) -> int:
    """``--sweep``: the grid of decoding settings, a table and an accuracy-vs-TPF plot."""
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for group, short, over in sweep_grid():
        cfg = base.replace(**{"steps": None, "revise_threshold": None, **over})
        row: dict[str, Any] = {"group": group, "short": short, "settings": over}
        row |= sweep_row(args, pipe, lcfg, cfg, tasks)
        rows.append(row)
        if not args.json:
            print(
                f"{group:<20}{short:<14} acc {row['accuracy']:.3f}  TPF {row['tpf']:.2f}  "
                + " ".join(f"{k}={v:.2f}" for k, v in row["tasks"].items()),
                flush=True,
            )
    from .plots import plot_accuracy_vs_tpf  # lazy: matplotlib loads only to plot

    png = plot_accuracy_vs_tpf(
        rows, out / "accuracy_vs_tpf.png", f"{pipe.path}: {args.limit} items/task"
    )
    (out / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n")
    with open(out / "sweep.md", "w") as f:
        f.write("| policy | setting | TPF | mean acc | " + " | ".join(tasks) + " |\n")
        f.write("|---|---|---|---|" + "---|" * len(tasks) + "\n")
        for r in rows:
            f.write(
                f"| {r['group']} | {r['short']} | {r['tpf']:.2f} | {r['accuracy']:.3f} | "
                + " | ".join(f"{r['tasks'][t]:.2f}" for t in tasks)
                + " |\n"
            )
    print(json.dumps({"sweep": rows, "plot": str(png), "table": str(out / "sweep.md")}))
    return 0
