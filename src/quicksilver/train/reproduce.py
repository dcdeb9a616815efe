"""The shipped checkpoints' lineage as data, and the runner behind ``make train``.

``STAGES`` lists every run that leads to the three shipped models of the task suite, in an order
where each stage's inputs (the weights it starts from, the distillation data it mixes in, the teacher
it decodes with) were written by an earlier stage; ``EDIT_STAGES`` continues from the default model's
run to the edit model (``quicksilver-edit``); ``LINEAGE`` is both. A training stage is a recipe plus
its ``schedule``: the recipe overrides it ran with, one after another on the same run directory (a run
stopped and resumed on a longer schedule, or switched to bf16 autocast at a checkpoint, as the shipped
runs were). A distillation stage is one ``quicksilver distill`` call.

``python -m quicksilver.train.reproduce`` runs them all from scratch (CPU, about a day);
``--stage NAME`` stops after that stage, ``--list`` prints the stages, their commands and what is
done, ``--edit`` takes the edit model's stages only, and ``--from-assets`` starts from the shipped
models' weights (copied where their runs' ``final/`` would be) and runs only the stages after them.
Every stage resumes: a finished one (its ``final/`` at the schedule's last step, or its distillation
file complete) is skipped, an interrupted one continues from its ``runs/*/ckpt.pt`` (or its file's
last chunk). Paths are relative to the working directory.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .distill import CHUNK, chunks_done, distill
from .recipes import V2_MIX, TrainConfig, get_recipe
from .trainer import Trainer, train


@dataclass(frozen=True)
class Distill:
    """A teacher's verified greedy replies to ``n`` fresh training prompts (the v2 mixture)."""

    teacher: str  # a run's final directory
    out: str  # the JSONL written
    n: int
    seed: int
    batch_size: int = 32

    def command(self) -> str:
        return (
            f"quicksilver distill --teacher {self.teacher} --out {self.out} --n {self.n} "
            f"--seed {self.seed} --batch-size {self.batch_size}"
        )


@dataclass(frozen=True)
class Stage:
    name: str
    about: str
    recipe: str = ""  # a training stage: the recipe ...
    schedule: tuple[Mapping[str, Any], ...] = ({},)  # ... and the overrides it ran with, in turn
    distill: Distill | None = None  # a distillation stage
    ships: str = ""  # the asset directory (src/quicksilver/assets/...) that is this run's final/

    def configs(self, **extra: Any) -> list[TrainConfig]:
        return [get_recipe(self.recipe, **{**seg, **extra}) for seg in self.schedule]

    @property
    def writes(self) -> str:
        """The run directory's final model, or the distillation file."""
        return self.distill.out if self.distill else f"{get_recipe(self.recipe).out}/final"

    @property
    def reads(self) -> list[str]:
        """The paths it needs: the weights it starts from, its distillation data, its teacher."""
        if self.distill:
            return [self.distill.teacher]
        return sorted({p for c in self.configs() for p in (c.init_from, c.distill_data) if p})

    def commands(self) -> list[str]:
        if self.distill:
            return [self.distill.command()]
        return [f"quicksilver train --recipe {self.recipe}{flags(seg)}" for seg in self.schedule]


def flags(overrides: Mapping[str, Any]) -> str:
    """Overrides as ``quicksilver train`` flags (bools as ``--x`` / ``--no-x``)."""
    out = ""
    for k, v in overrides.items():
        flag = "--" + ("" if v is not False else "no-") + k.replace("_", "-")
        out += f" {flag}" if isinstance(v, bool) else f" {flag} {v}"
    return out


def _twin_stages() -> list[Stage]:
    return [
        Stage(
            "ar-v1",
            "the v1 AR baseline from scratch: 2,000 steps in float32, then the schedule extended to "
            "10,000 in bf16 and stopped at 7,900 (20.2M data tokens: the v1 AR twin)",
            "small-ar",
            ({"steps": 2000, "cpu_bf16": False}, {"stop_at": 7900}),
        ),
        Stage(
            "ar-v2",
            "v2 stage 1: the v1 twin continued 600 steps on natural phrasings, agent-loop turns "
            "and a 1,024-token context",
            "small-ar-v2",
        ),
        Stage(
            "ar-v2-twin",
            "the v2 AR twin: stage 1 continued on stage 2's data stream for its 5,000 steps",
            "small-ar-v2-twin",
        ),
        Stage(
            "ar-v2-twin6k",
            "the twin continued for stage 3's 1,000 steps: the shipped AR twin, v3's parent",
            "small-ar-v2-twin6k",
            ships="model-ar",
        ),
    ]


def _draft_stages() -> list[Stage]:
    chain = ["more", "more2", "more3", "more4", "more5", "more6", "more7", "more8"]
    return [
        Stage(
            "draft",
            "v3: the twin trained to draft its own next tokens (ar_draft, draft weight 0.3)",
            "small-ar-draft-w03-full",
        ),
        *[
            Stage(f"draft-{c}", "the next cosine cycle at lr 1e-4", f"small-ar-draft-{c}")
            for c in chain
        ],
        Stage(
            "draft-k8",
            "one more cycle with mask blocks sized for the decode k (7-9 positions, 8 a sequence)",
            "small-ar-draft-k8",
        ),
        Stage(
            "distill-v3-self",
            "-k8's own verified greedy replies to 6,000 fresh training prompts",
            distill=Distill(
                "runs/small-ar-draft-k8/final", "runs/distill3/self_v37.jsonl", 6000, 21
            ),
        ),
        Stage(
            "draft-sd",
            "-k8 trained another cycle on half fresh data, half its own replies: v3.8",
            "small-ar-draft-sd",
            ships="model",
        ),
    ]


def _diffusion_stages() -> list[Stage]:
    return [
        Stage(
            "diffusion-v2",
            "v2 stage 2: stage 1 adapted to block diffusion, 5,000 steps: its first 200 on a "
            "2,000-step schedule, on to 1,200 on a 1,200-step one, then a 5,000-step one; float32 "
            "to step 2,800",
            "small-ar2d-v2",
            (
                {"steps": 2000, "stop_at": 200, "cpu_bf16": False},
                {"steps": 1200, "cpu_bf16": False},
                {"stop_at": 2800, "cpu_bf16": False},
                {},
            ),
        ),
        Stage(
            "distill-v2-self",
            "stage 2's own verified greedy replies to 3,000 fresh training prompts",
            distill=Distill("runs/small-ar2d-v2/final", "runs/distill2/self5000.jsonl", 3000, 8),
        ),
        Stage(
            "diffusion-v2-sdcf",
            "v2 stage 3: 1,000 steps on half fresh data, half those replies, under certainty "
            "forcing: the shipped block-diffusion model",
            "small-ar2d-v2-sdcf",
            ships="model-diffusion",
        ),
    ]


# the AR twin's line first, then the default model's chain from it, then the diffusion model's
# branch, so that ``--stage`` stops as soon as a model is built
STAGES: list[Stage] = [*_twin_stages(), *_draft_stages(), *_diffusion_stages()]

# quicksilver-edit: a second network for the apply and next-edit routes, from v3.8's weights (the
# draft-sd stage's final, which is assets/model) through the copy drill to the edit tasks, with none of
# the v2 mixture replayed (recipes.py, docs/LOG.md 2026-12-07)
EDIT_STAGES: list[Stage] = [
    Stage(
        "edit-drill",
        "v3.8 drilled to copy: copy_short alone at lr 1e-3 (the copy circuit forms here)",
        "edit-drill",
    ),
    Stage(
        "edit-drill-long",
        "the drill on long files too (copy_short and copy_text)",
        "edit-drill-long",
    ),
    Stage(
        "edit-copy",
        "code files to copy unchanged (the lexicon's names and made-up ones) beside apply_edit, lr 5e-4",
        "edit-copy",
    ),
    Stage(
        "edit",
        "apply_edit, next_edit, fim and the code copies over both kinds of names, lr 3e-4: "
        "quicksilver-edit",
        "edit",
        ships="model-edit",
    ),
]

# every shipped model's stages, in order (``make train``)
LINEAGE: list[Stage] = [*STAGES, *EDIT_STAGES]
ASSETS = Path(__file__).resolve().parent.parent / "assets"


# ---- state ----------------------------------------------------------------------------------------
def final_step(out: Path) -> int:
    """The step of a run's exported final model (-1 when none)."""
    state = out / "final" / "train_state.json"
    return int(json.loads(state.read_text())["step"]) if state.is_file() else -1


def ckpt_step(out: Path) -> int:
    """The step of a run's resumable checkpoint (-1 when none)."""
    ckpt = out / "ckpt.pt"
    if not ckpt.is_file():
        return -1
    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["step"])


def end(cfg: TrainConfig) -> int:
    return cfg.stop_at or cfg.steps


def done(stage: Stage) -> bool:
    if stage.distill:
        return chunks_done(Path(stage.distill.out)) >= -(-stage.distill.n // CHUNK)
    return final_step(Path(get_recipe(stage.recipe).out)) >= end(stage.configs()[-1])


def status(stage: Stage) -> str:
    if done(stage):
        return "done"
    if stage.distill:
        chunks = chunks_done(Path(stage.distill.out))
        return f"{chunks} chunks written" if chunks else "to do"
    out = Path(get_recipe(stage.recipe).out)
    step = max(final_step(out), ckpt_step(out))
    return f"at step {step}" if step >= 0 else "to do"


def place_assets(stages: Sequence[Stage], assets: Path = ASSETS) -> list[str]:
    """Copy each shipped model that ``stages`` read into its run's ``final/`` (where missing), so a
    line that starts from what ships runs without retraining the lineage before it. Only an asset
    whose recorded run and step are that stage's own is placed."""
    wanted = {p for s in stages for p in s.reads}
    placed = []
    for s in LINEAGE:
        src = assets / s.ships
        if not s.ships or s.writes not in wanted or done(s) or not src.is_dir():
            continue
        record = json.loads((src / "train_config.json").read_text())
        step = json.loads((src / "train_state.json").read_text())["step"]
        if record["out"] + "/final" != s.writes or step != end(s.configs()[-1]):
            continue
        shutil.copytree(src, s.writes, dirs_exist_ok=True)
        placed.append(s.writes)
    return placed


# ---- running ------------------------------------------------------------------------------------
def run_train(stage: Stage, threads: int, fit: Callable[[TrainConfig], Any]) -> None:
    """Each schedule segment not yet reached, each resuming the run's checkpoint."""
    for cfg in stage.configs(**({"threads": threads} if threads else {})):
        out = Path(cfg.out)
        if final_step(out) >= end(cfg):
            continue
        if ckpt_step(out) >= end(cfg):  # saved at its stop, killed before the export
            Trainer(cfg).export("final")
            continue
        fit(cfg)


def select(stages: Sequence[Stage], last: str | None) -> list[Stage]:
    names = [s.name for s in stages]
    if last is None:
        return list(stages)
    if last not in names:
        raise SystemExit(f"unknown stage {last!r}; choose one of {', '.join(names)}")
    return list(stages[: names.index(last) + 1])


def reproduce(
    stages: Sequence[Stage] = LINEAGE,
    last: str | None = None,
    threads: int = 0,
    fit: Callable[[TrainConfig], Any] = train,
    decode: Callable[..., Any] = distill,
) -> list[str]:
    """Run the stages up to and including ``last`` (all by default); returns the names run."""
    ran = []
    for stage in select(stages, last):
        if done(stage):
            print(f"[{stage.name}] done: {stage.writes}", flush=True)
            continue
        print(f"[{stage.name}] {stage.about}", flush=True)
        if stage.distill:
            d = stage.distill
            rep = decode(d.teacher, Path(d.out), d.n, V2_MIX, d.seed, batch_size=d.batch_size)
            print(json.dumps(rep), flush=True)
        else:
            run_train(stage, threads, fit)
        ran.append(stage.name)
    return ran


def listing(stages: Sequence[Stage]) -> str:
    lines = []
    for s in stages:
        ships = f"  -> assets/{s.ships}" if s.ships else ""
        lines.append(f"{s.name}  [{status(s)}]  writes {s.writes}{ships}")
        lines.append(f"    {s.about}")
        lines += [f"    $ {c}" for c in s.commands()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m quicksilver.train.reproduce",
        description="Train the shipped models from scratch, stage by stage (resumable).",
    )
    p.add_argument("--stage", help="stop after this stage (default: run every stage)")
    p.add_argument("--list", action="store_true", help="print the stages and their state; run none")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--edit", action="store_true", help="only the edit model's stages (EDIT_STAGES)")
    p.add_argument(
        "--from-assets",
        action="store_true",
        help="start from the shipped models' weights (copied into the runs the later stages read) "
        "and run only the stages after them",
    )
    args = p.parse_args(argv)
    stages = EDIT_STAGES if args.edit else LINEAGE
    if args.from_assets:
        stages = [s for s in stages if s not in STAGES]
    if args.list:
        print(listing(select(stages, args.stage)))
        return 0
    if args.from_assets:
        for path in place_assets(stages):
            print(f"placed the shipped model at {path}", flush=True)
    reproduce(stages, args.stage, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
