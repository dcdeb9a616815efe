"""The shipped checkpoints' lineage as data, and the runner behind ``make train``.

``STAGES`` lists every run that leads to the three shipped models, in an order where each stage's
inputs (the weights it starts from, the distillation data it mixes in, the teacher it decodes with)
were written by an earlier stage. A training stage is a recipe plus its ``schedule``: the recipe
overrides it ran with, one after another on the same run directory (a run stopped and resumed on a
longer schedule, or switched to bf16 autocast at a checkpoint, as the shipped runs were). A
distillation stage is one ``quicksilver distill`` call.

``python -m quicksilver.train.reproduce`` runs them all from scratch (CPU, about a day);
``--stage NAME`` stops after that stage, ``--list`` prints the stages, their commands and what is
done. Every stage resumes: a finished one (its ``final/`` at the schedule's last step, or its
distillation file complete) is skipped, an interrupted one continues from its ``runs/*/ckpt.pt``
(or its file's last chunk). Paths are relative to the working directory.
"""

from __future__ import annotations

import argparse
import json
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

# runs toward the next shipped models, from what ships now (``--next`` runs them; each reads a
# shipped stage's final weights)
NEXT: list[Stage] = [
    Stage(
        "draft-drill",
        "v3.8 drilled to copy: copy_short alone at lr 1e-3 (v4; the copy circuit forms here)",
        "small-ar-draft-drill",
    ),
    Stage(
        "ar-twin-drill",
        "the shipped twin on the drill's stream, the same examples step for step",
        "small-ar-twin-drill",
    ),
    Stage(
        "draft-drill-long",
        "the drill on long files too (copy_short and copy_text)",
        "small-ar-draft-drill-long",
    ),
    Stage("ar-twin-drill-long", "the twin on the same stream", "small-ar-twin-drill-long"),
    Stage(
        "draft-copy",
        "the drilled model on a stream mostly of apply_edit, next_edit and tool_open at lr 5e-4",
        "small-ar-draft-copy",
    ),
    Stage(
        "ar-twin-copy",
        "the drilled twin on the copy stage's stream, the same examples step for step",
        "small-ar-twin-copy",
    ),
    Stage(
        "draft-code",
        "the copy stage's stream plus copy_code (code files to copy unchanged) at lr 3e-4",
        "small-ar-draft-code",
    ),
    Stage("ar-twin-code", "the twin on the same stream", "small-ar-twin-code"),
    Stage("draft-code2", "600 more steps of the same mixture", "small-ar-draft-code2"),
    Stage("ar-twin-code2", "the twin on the same stream", "small-ar-twin-code2"),
    Stage(
        "draft-names",
        "the code stage's stream plus the edit and copy tasks over made-up names",
        "small-ar-draft-names",
    ),
    Stage("ar-twin-names", "the twin on the same stream", "small-ar-twin-names"),
    Stage(
        "draft-edit",
        "the names stage's model on the v2 mixture plus the edit tasks (a little over made-up names) "
        "at lr 2e-4 (v4)",
        "small-ar-draft-edit",
    ),
    Stage(
        "ar-twin-edit",
        "the twin of the names stage continued on the edit stage's stream",
        "small-ar-twin-edit",
    ),
    Stage(
        "draft-restore",
        "1,500 more steps with a quarter of the examples on edits, to bring the v2 tasks back (v4)",
        "small-ar-draft-restore",
    ),
    Stage(
        "ar-twin-restore",
        "the twin of the edit stage continued on v4's last stream",
        "small-ar-twin-restore",
    ),
    Stage(
        "draft-drill-mix",
        "v3.8 drilled to copy with the v2 mixture replayed as half the examples, lr 1e-3 (v5; the "
        "drill alone wipes arithmetic)",
        "small-ar-draft-drill-mix",
    ),
    Stage(
        "draft-edit5",
        "the replayed drill's model on the v2 mixture plus every edit and copy task at lr 3e-4 (v5)",
        "small-ar-draft-edit5",
    ),
    Stage(
        "ar-twin-drill-mix",
        "the shipped twin on the replayed drill's stream, the same examples step for step",
        "small-ar-twin-drill-mix",
    ),
    Stage("ar-twin-edit5", "the twin on v5's edit stream", "small-ar-twin-edit5"),
    Stage(
        "draft-edit5-more",
        "3,000 more steps of v5's edit mixture (does replay slow the edits or block them?)",
        "small-ar-draft-edit5-more",
    ),
]


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
    stages: Sequence[Stage] = STAGES,
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
    p.add_argument(
        "--next", action="store_true", help="the runs toward the next release (NEXT) instead"
    )
    args = p.parse_args(argv)
    stages = NEXT if args.next else STAGES
    if args.list:
        print(listing(select(stages, args.stage)))
        return 0
    reproduce(stages, args.stage, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
