"""``quicksilver train --recipe NAME [--field value ...]``: the parser (one flag per ``TrainConfig``
field) and the handler. Under ``torchrun`` every process runs the same command (data parallel)."""

from __future__ import annotations

import argparse
import json

from ..cli_util import add_dataclass_args
from .distill import KEEP, distill
from .recipes import RECIPES, V2_MIX, TrainConfig, get_recipe
from .trainer import train

HELP = {
    "out": "run directory (checkpoints, metrics.jsonl, final/)",
    "objective": "diffusion | diffusion_single | ar",
    "tasks": "task mixture, NAME:WEIGHT,...",
    "sub_prob": "substitution noise: fraction of visible answer tokens replaced by wrong ones",
    "time_limit": "stop and save after this many seconds (0: none)",
    "resume": "continue from out/ckpt.pt when it exists",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    t = sub.add_parser(
        "train", help="train a model on the task suite (diffusion or the AR baseline)"
    )
    t.add_argument(
        "--recipe", default="small", help=f"starting configuration: {', '.join(sorted(RECIPES))}"
    )
    t.add_argument(
        "--print-config", action="store_true", help="print the resolved config as JSON and exit"
    )
    add_dataclass_args(t, TrainConfig, help=HELP)


def add_distill_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "distill",
        help="a teacher's verified greedy replies to training prompts, as training data (JSONL)",
    )
    d.add_argument("--teacher", required=True, help="checkpoint directory of the teacher")
    d.add_argument("--out", required=True, help="JSONL to append to (a rerun resumes it)")
    d.add_argument("--n", type=int, default=2000, help="training prompts to decode")
    d.add_argument("--tasks", default=V2_MIX, help="task mixture, NAME:WEIGHT,...")
    d.add_argument("--seed", type=int, default=0, help="seed of the prompt stream")
    d.add_argument("--instant-frac", type=float, default=0.15, dest="instant_frac")
    d.add_argument("--batch-size", type=int, default=16, dest="batch_size")
    d.add_argument(
        "--keep",
        choices=KEEP,
        default="verified",
        help="replies to keep: the verified ones, or all (the unverified train the drafts only)",
    )


def handle_distill(args: argparse.Namespace) -> int:
    from pathlib import Path

    rep = distill(
        args.teacher,
        Path(args.out),
        args.n,
        args.tasks,
        args.seed,
        args.instant_frac,
        args.batch_size,
        args.keep,
    )
    print(json.dumps(rep))
    return 0


def handle(args: argparse.Namespace) -> int:
    import dataclasses

    names = {f.name for f in dataclasses.fields(TrainConfig)}
    overrides = {k: v for k, v in vars(args).items() if k in names and v is not None}
    cfg = get_recipe(args.recipe, **overrides)
    if args.print_config:
        print(json.dumps(cfg.to_dict()))
        return 0

    path = train(cfg)
    print(json.dumps({"final": str(path), "out": cfg.out}))
    return 0
