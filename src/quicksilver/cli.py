"""The ``quicksilver`` command: a thin layer over the library. Errors print one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .assets import resolve_model
from .bench.decode import add_arguments as decode_bench_args
from .bench.decode import run_decode_bench
from .bench.gpu_families import add_arguments as families_bench_args
from .bench.gpu_families import run as run_families_bench
from .bench.live_tools import add_arguments as tools_bench_args
from .bench.live_tools import run as run_tools_bench
from .bench.serve import add_arguments as serve_bench_args
from .bench.serve import route_max_tokens, run_serve_bench
from .bench.serve_replicas import run_replicas_bench
from .bench.serve_vs import add_agents_arguments, run_agents, run_vs_llama_cpp
from .bench.shapes import add_arguments as shapes_bench_args
from .bench.shapes import run as run_shapes_bench
from .bench.soak import add_arguments as soak_bench_args
from .bench.soak import run_soak_bench
from .bench.speed import add_arguments as speed_bench_args
from .bench.speed import run_speed_bench
from .bench.steps import add_arguments as steps_bench_args
from .bench.steps import run_steps_bench
from .cli_util import (
    MODEL_HELP,
    add_dataclass_args,
    add_load_args,
    add_revision_arg,
    dataclass_from_args,
    fail,
)
from .errors import QuicksilverError
from .eval.cli import add_parser as add_eval_parser
from .eval.cli import handle as handle_eval
from .live import show
from .models.families.diffusion_gemma_net import DiffusionGemmaLM
from .models.gguf_export import export_gguf
from .models.init import init_model
from .pipeline import LOAD_HELP, LoadConfig, Pipeline, load
from .sampling import SamplerConfig
from .server.config import LOAD_HIDDEN, SERVER_CHOICES, SERVER_HELP, SERVER_HIDDEN, ServerConfig
from .server.entry import serve
from .train.cli import add_distill_parser, handle_distill
from .train.cli import add_parser as add_train_parser
from .train.cli import handle as handle_train

SAMPLER_RENAME = {"max_new_tokens": "max-tokens"}
SAMPLER_SKIP = frozenset({"record_canvas"})
SAMPLER_HELP = {
    "max_new_tokens": "canvas length: most tokens to generate",
    "policy": "unmasking policy: low_confidence, threshold, margin, entropy, random",
    "threshold": "confidence bound of the threshold policy, in (0, 1]",
    "top_k": "with --temperature: sample among the k most likely tokens (0: all)",
    "steps": "refinement steps in all (schedule policies; a cap for threshold)",
    "block_length": "semi-autoregressive block length",
    "window": "decode window of a block-causal model: positions a step computes inside its block "
    "(default: 8 on a CPU, the whole block on a GPU)",
    "revise_threshold": "re-mask committed tokens whose confidence falls below this (revision; off if unset)",
    "max_revisions": "how often one position may be re-masked",
    "editing_threshold": "rewrite a committed token of the current block where the model's top token "
    "differs with probability above this (LLaDA2.1 editing; 0: wherever it differs; off if unset)",
    "max_post_steps": "editing: most extra passes over a filled block while they still edit",
    "stop_at_eos": "stop once a stop token and everything before it are committed",
}

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(
    name: str,
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    def deco(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = fn
        return fn

    return deco


def load_pipeline(args: argparse.Namespace) -> Any:
    """``quicksilver.load`` of ``--model`` with the ``LoadConfig`` flags."""
    return load(
        resolve_model(args.model, revision=args.revision), dataclass_from_args(LoadConfig, args)
    )


def sampler_from_args(args: argparse.Namespace) -> Any:

    return dataclass_from_args(SamplerConfig, args)


@command("generate")
def cmd_generate(args: argparse.Namespace) -> int:

    pipe = load_pipeline(args)
    # family defaults < flags
    cfg = dataclass_from_args(type(pipe.sampler_config()), args, base=pipe.sampler_config())
    opts = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}
    chat = not args.raw and pipe.tokenizer.chat_template is not None
    prompt: Any = args.prompt
    if chat:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
    if args.show:
        opts["record_canvas"] = True
        res = show(
            pipe.stream(prompt, chat=chat, **opts),
            pipe.tokenizer,
            pipe.mask_id,
            delay=args.show_delay,
        )
    else:
        res = pipe.generate(prompt, chat=chat, **opts)
    if args.json:
        print(
            json.dumps(
                {
                    k: res.to_json()[k]
                    for k in (
                        "text",
                        "tokens",
                        "nfe",
                        "steps",
                        "tpf",
                        "seconds",
                        "finish_reason",
                        "prompt_tokens",
                    )
                }
                | {"runtime": pipe.runtime_name}
            )
        )
    elif not args.show:
        print(res.text)
    else:
        print(
            f"[{len(res.tokens)} tokens, {res.nfe} forward passes, TPF {res.tpf:.2f}, {res.seconds:.2f}s, "
            f"finish: {res.finish_reason}]"
        )
    return 0


@command("init-model")
def cmd_init_model(args: argparse.Namespace) -> int:

    overrides = {
        k: getattr(args, k) for k in ("attention", "block_size") if getattr(args, k) is not None
    }
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.force:
        raise QuicksilverError(f"{out} exists and is not empty (use --force to overwrite)")
    init_model(out, args.preset, seed=args.seed, dtype=args.dtype, **overrides)
    print(f"wrote a randomly initialised '{args.preset}' checkpoint to {out}")
    return 0


@command("export")
def cmd_export(args: argparse.Namespace) -> int:

    path = resolve_model(args.model, ar=True, revision=args.revision)
    print(json.dumps(export_gguf(path, args.out, args.dtype)))
    return 0


def network_shape(pipe: Pipeline) -> dict[str, Any]:
    """``info``'s shape fields: the generic transformer's config, or DiffusionGemma's (its block is
    its canvas; its full-attention layers have their own KV heads, the sliding ones' are shown)."""
    net = pipe.network
    block: int | None
    if isinstance(net, DiffusionGemmaLM):
        g = net.config
        kv, block, shift, mask = g.sliding.n_kv_heads, g.canvas_length, False, None
        dims = (g.d_model, g.n_layers, g.n_heads)
    else:
        c = pipe.config
        kv, shift, mask = c.n_kv_heads, c.logit_shift, c.mask_token_id
        block = c.block_size if c.attention == "block_causal" else None
        dims = (c.d_model, c.n_layers, c.n_heads)
    return {
        "attention": pipe.attention,
        "block_size": block,
        **dict(zip(("d_model", "n_layers", "n_heads"), dims)),
        "n_kv_heads": kv,
        "vocab_size": net.config.vocab_size,
        "max_seq_len": pipe.max_context,
        "logit_shift": shift,
        "mask_token_id": mask,
    }


@command("info")
def cmd_info(args: argparse.Namespace) -> int:
    path = resolve_model(args.path, revision=args.revision)
    pipe = load(path)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    info = {
        "path": str(path),
        "architecture": pipe.network.config.architecture,
        "parameters": pipe.network.num_params(),
        **network_shape(pipe),
        "stop_token_ids": pipe.stop_ids,
        "chat_template": pipe.tokenizer.chat_template is not None,
        "bytes_on_disk": size,
    }
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k:>16}: {v}")
    return 0


@command("bench")
def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench == "decode":
        path = resolve_model(args.model, which="diffusion model", revision=args.revision)
        return run_decode_bench(path, args)
    if args.bench == "serve" and args.max_tokens is None:
        args.max_tokens = route_max_tokens(args.route)
    if args.bench == "serve" and args.replicas:
        return run_replicas_bench(args)
    if args.bench == "serve" and args.vs_llama_cpp:
        return run_vs_llama_cpp(args)
    runs: dict[str, Callable[[argparse.Namespace], int]] = {
        "speed": run_speed_bench,
        "serve": run_serve_bench,
        "soak": run_soak_bench,
        "shapes": run_shapes_bench,
        "steps": run_steps_bench,
        "families": run_families_bench,
        "agents": run_agents,
        "tools": run_tools_bench,
    }
    if args.bench not in runs:
        raise QuicksilverError(f"unknown benchmark {args.bench!r}")
    return runs[args.bench](args)


@command("serve")
def cmd_serve(args: argparse.Namespace) -> int:
    return serve(dataclass_from_args(ServerConfig, args), mock_step_delay=args.mock_step_delay)


@command("train")
def cmd_train(args: argparse.Namespace) -> int:
    return handle_train(args)


@command("distill")
def cmd_distill(args: argparse.Namespace) -> int:
    return handle_distill(args)


@command("eval")
def cmd_eval(args: argparse.Namespace) -> int:
    return handle_eval(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="quicksilver", description="Reasoning diffusion LLM engine and server."
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_generate_parser(sub)
    add_model_parsers(sub)
    add_bench_parsers(sub)
    add_train_parser(sub)
    add_distill_parser(sub)
    add_eval_parser(sub)
    return p


def add_generate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("generate", help="generate text from a prompt by parallel refinement")
    g.add_argument("prompt", help="the prompt (a user message when the model has a chat template)")
    g.add_argument("--model", help=MODEL_HELP + " (default: the embedded model)")
    add_dataclass_args(
        g, SamplerConfig, rename=SAMPLER_RENAME, skip=SAMPLER_SKIP, help=SAMPLER_HELP
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with text, tokens, nfe, steps, tpf, seconds",
    )
    g.add_argument("--show", action="store_true", help="live view of the canvas being refined")
    g.add_argument(
        "--show-delay", type=float, default=0.0, help="seconds to pause per step in --show"
    )
    g.add_argument(
        "--raw", action="store_true", help="plain completion: do not apply the chat template"
    )
    g.add_argument("--system", help="a system message (chat models)")
    add_load_args(g)


def add_model_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """init-model, serve, export gguf, info."""
    i = sub.add_parser("init-model", help="write a randomly initialised checkpoint")
    i.add_argument("out", help="output directory")
    i.add_argument("--preset", default="small", help="tiny, small or base (default: small)")
    i.add_argument("--seed", type=int, default=0)
    i.add_argument("--attention", choices=["bidirectional", "block_causal", "causal"])
    i.add_argument("--block-size", type=int, dest="block_size")
    i.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    i.add_argument("--force", action="store_true", help="overwrite a non-empty directory")

    sv = sub.add_parser(
        "serve", help="the OpenAI-compatible HTTP server (default: the embedded model)"
    )
    add_dataclass_args(sv, ServerConfig, help=SERVER_HELP, choices=SERVER_CHOICES)
    sv.add_argument(  # seconds per step of the mock engine (tests of streaming and disconnects)
        "--mock-step-delay", type=float, default=0.0, dest="mock_step_delay"
    )
    hide(sv, SERVER_HIDDEN | {"mock_step_delay"})

    ex = sub.add_parser("export", help="write a checkpoint in another runtime's format")
    exsub = ex.add_subparsers(dest="format", required=True, metavar="FORMAT")
    eg = exsub.add_parser(
        "gguf", help="a causal LLaMA/Qwen-shaped checkpoint as GGUF (llama.cpp, Ollama)"
    )
    eg.add_argument("--model", help=MODEL_HELP + " (default: the embedded AR twin)")
    add_revision_arg(eg)
    eg.add_argument("--out", required=True, help="the .gguf file to write")
    eg.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])

    n = sub.add_parser("info", help="describe a checkpoint")
    n.add_argument("path", nargs="?", help=MODEL_HELP + " (default: the embedded model)")
    add_revision_arg(n)
    n.add_argument("--json", action="store_true")


BENCHES = {
    "decode": (decode_bench_args, "one-token-per-step vs threshold vs the reference decoder"),
    "speed": (
        speed_bench_args,
        "verify (what serve runs) vs the AR twin vs the diffusion decoders, single stream",
    ),
    "serve": (
        serve_bench_args,
        "a live server under load, and an agent loop with/without prefix cache",
    ),
    "agents": (
        add_agents_arguments,
        "the most concurrent tool-calling agents within a latency SLO, vs llama-server",
    ),
    "soak": (
        soak_bench_args,
        "N streams for T minutes with disconnects and overload bursts: failures, RSS",
    ),
    "shapes": (
        shapes_bench_args,
        "CPU cost of a step per window vs an AR token step at published shapes "
        "(random weights; float32, bfloat16, int8)",
    ),
    "steps": (steps_bench_args, "ms per step of each CPU backend (torch, onnx, openvino)"),
    "tools": (
        tools_bench_args,
        "tools never seen, through the live API: 4 fixed prompts and tool_open's held-out set",
    ),
    "families": (
        families_bench_args,
        "GPU speed of LLaDA-8B / Dream-7B shapes (random weights)",
    ),
}


def add_bench_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("bench", help="benchmarks (end with one line of JSON)")
    bsub = b.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name, (add_arguments, help) in BENCHES.items():
        bp = bsub.add_parser(name, help=help)
        add_arguments(bp)
        hide(bp, {a.dest for a in bp._actions if is_hidden_load_flag(a)})


def is_hidden_load_flag(action: argparse.Action) -> bool:
    """A ``LOAD_HIDDEN`` flag that ``add_load_args`` added (not a bench's own of the same name,
    such as ``bench families --cuda-graphs``)."""
    text = LOAD_HELP.get(action.dest)
    return action.dest in LOAD_HIDDEN and text is not None and (action.help or "").startswith(text)


def hide(parser: argparse.ArgumentParser, dests: frozenset[str] | set[str]) -> None:
    """Leave these flags out of ``--help``; they still parse and act as before."""
    for action in parser._actions:
        if action.dest in dests:
            action.help = argparse.SUPPRESS


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except QuicksilverError as e:
        fail(str(e))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        fail("out of memory: use a shorter canvas or a smaller batch")


if __name__ == "__main__":
    sys.exit(main())
