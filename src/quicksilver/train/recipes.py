"""``TrainConfig`` (every trainer option; CLI flags map 1:1 onto fields) and named recipes.

A recipe is a ``TrainConfig`` with chosen values; ``quicksilver train --recipe NAME --field value``
starts from the recipe and overrides single fields. The config is saved as JSON beside every
checkpoint, so any run can be reproduced from its directory. The recipes here are the runs that lead
to the shipped models (plus the CLI's default and a tiny one for tests); ``train/reproduce.py`` runs
them in order with the schedules they ran (``make train``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from .data import parse_weights
from .objective import OBJECTIVES

DEFAULT_MIX = "path_star:1,sudoku4:1,countdown3:1.5,multiply:1.25,tool_call:1,chat:0.3,fim:0.25"
DEFAULT_EVAL = "path_star,sudoku4,countdown3,multiply,tool_call,chat,fim"
# the second generation: natural phrasings (every generator's training wording) and agent-loop turns
V2_MIX = DEFAULT_MIX + ",tool_loop:0.6"


@dataclass
class TrainConfig:
    out: str = (
        "runs/default"  # run directory: checkpoints, metrics.jsonl, the final model in out/final
    )
    objective: str = (
        "diffusion"  # diffusion | diffusion_single | ar (the equal-size causal baseline)
    )
    # model
    d_model: int = 192
    n_layers: int = 6
    n_heads: int = 4
    mlp_hidden: int = 512
    block_size: int = 32
    logit_shift: bool = (
        False  # position p predicted from p - 1 (Dream / Fast-dLLM v2; keeps an AR init's head)
    )
    init_from: str = (
        ""  # start from this checkpoint's weights and tokenizer (e.g. adapt the AR baseline)
    )
    max_seq_len: int = 384
    vocab_size: int = 1024  # BPE vocabulary trained on generated text (individual digits)
    tokenizer_texts: int = 20000  # generated texts the BPE merges are learned from
    # data
    tasks: str = DEFAULT_MIX  # task:weight mixture; fresh examples every batch
    instant_frac: float = 0.15  # examples rendered with an empty <think></think> (instant mode)
    max_len: int = 352  # drop longer examples
    distill_data: str = ""  # JSONL of a teacher's verified replies (`quicksilver distill`)
    distill_frac: float = 0.5  # share of examples drawn from distill_data when it is set
    # next-token loss on distill_data's verified replies too (False: they train the drafts only;
    # replies the verifier rejected, `distill --keep all`, always train the drafts only)
    distill_ar: bool = True
    # noise (diffusion objectives)
    eps: float = 1e-3
    sub_prob: float = 0.1  # substitution noise: fraction of visible answer tokens replaced
    sub_weight: float = 1.0
    keep_weight: float = 0.1
    certainty_weight: float = 0.0  # certainty forcing (dParallel): entropy of right masked guesses
    # drafting (objective ar_draft: the verify decoder's network)
    draft_len: int = 8  # decode k the appended all-[MASK] blocks are sized around
    draft_blocks: int = 6  # mask blocks appended per sequence
    draft_spread: int | None = (
        None  # block sizes drawn from draft_len ± this (None: ± draft_len // 2)
    )
    draft_weight: float = 1.0  # weight of the masked-token loss beside the AR loss
    draft_teacher: str = "data"  # the mask blocks' targets: data, or self (the stream's own logits)
    # optimisation
    batch_size: int = 32  # global, split over data-parallel processes
    bucket: int = 8  # batches generated at once and grouped by length (less padding)
    steps: int = 2000
    lr: float = 1e-3
    min_lr_frac: float = 0.1
    warmup: int = 40
    weight_decay: float = 0.1
    beta2: float = 0.98
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 0  # torch intra-op threads (0: leave the default)
    cpu_bf16: bool = (
        False  # bf16 autocast on CPU too (AMX / avx512_bf16 matmuls: ~1.5x tokens/s, docs/LOG.md)
    )
    # bookkeeping
    eval_every: int = 300  # steps between held-out evaluations (0: never)
    eval_tasks: str = DEFAULT_EVAL
    eval_limit: int = 24  # held-out items per task at each evaluation
    ckpt_every: int = 100  # steps between resumable checkpoints
    log_every: int = 10
    time_limit: float = 0.0  # stop (and save) after this many seconds (0: no limit)
    stop_at: int = (
        0  # stop (and save) at this step, schedule unchanged; resume later (0: run to the end)
    )
    save_dtype: str = "bfloat16"  # dtype of the exported model directory
    resume: bool = True  # continue from out/ckpt.pt when it exists

    def validate(self) -> TrainConfig:
        if self.objective not in OBJECTIVES:
            raise ConfigError(
                f"unknown objective {self.objective!r}; choose one of {sorted(OBJECTIVES)}"
            )
        for name in (
            "d_model",
            "n_layers",
            "n_heads",
            "block_size",
            "batch_size",
            "steps",
            "vocab_size",
            "tokenizer_texts",
            "draft_len",
            "draft_blocks",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.draft_spread is not None and not 0 <= self.draft_spread < self.draft_len:
            raise ConfigError(f"draft_spread must be in [0, draft_len), got {self.draft_spread}")
        if self.draft_teacher not in ("data", "self"):
            raise ConfigError(f"draft_teacher must be data or self, got {self.draft_teacher!r}")
        if not 0 <= self.distill_frac <= 1:
            raise ConfigError(f"distill_frac must be in [0, 1], got {self.distill_frac}")
        if not 0 <= self.sub_prob < 1 or not 0 <= self.instant_frac <= 1:
            raise ConfigError("sub_prob must be in [0, 1) and instant_frac in [0, 1]")
        if self.lr <= 0 or not 0 <= self.min_lr_frac <= 1:
            raise ConfigError("lr must be positive and min_lr_frac in [0, 1]")
        if self.save_dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"save_dtype must be float32, bfloat16 or float16, got {self.save_dtype!r}"
            )

        parse_weights(self.tasks)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def then(prev: TrainConfig, name: str, seed: int, **changes: Any) -> TrainConfig:
    """The next link of a chain: ``prev``'s recipe continued from its final weights."""
    return dataclasses.replace(
        prev, out=f"runs/{name}", init_from=f"{prev.out}/final", seed=seed, **changes
    )


# v1: the equal-size AR baseline from scratch. Its step-7,900 weights (20.2M data tokens, the v1 AR
# twin) are the parent of every shipped model; the first 2,000 steps ran in float32 on a 2,000-step
# schedule (train/reproduce.py replays the schedule it ran)
SMALL_AR = TrainConfig(out="runs/small-ar", objective="ar", steps=10000, cpu_bf16=True)

# v2, stage 1: the v1 AR twin continued on natural phrasings and agent-loop turns with a 1,024-token
# context (RoPE: the same weights serve the longer context)
V2_STAGE1 = TrainConfig(
    out="runs/small-ar-v2",
    objective="ar",
    init_from="runs/small-ar/final",
    max_seq_len=1024,
    max_len=1000,
    tasks=V2_MIX,
    seed=3,
    steps=600,
    lr=3e-4,
    eval_every=500,
)

# v2, stage 2: the finished stage-1 AR model adapted to block diffusion (as Dream / Fast-dLLM v2
# adapt finished AR models), 5,000 steps; float32 to step 2,800 (train/reproduce.py)
V2_STAGE2 = TrainConfig(
    out="runs/small-ar2d-v2",
    init_from="runs/small-ar-v2/final",
    logit_shift=True,
    max_seq_len=1024,
    max_len=1000,
    tasks=V2_MIX,
    seed=4,
    steps=5000,
    lr=2e-4,
    eval_every=1000,
    cpu_bf16=True,
)

# v2, stage 3: 1,000 steps from stage 2's final weights at lr 1e-4, half of them stage 2's own
# verified greedy replies (self-distillation, dParallel's recipe) under certainty forcing (W = 2):
# assets/model-diffusion
V2_STAGE3 = dataclasses.replace(
    V2_STAGE2,
    out="runs/small-ar2d-v2-sdcf",
    init_from="runs/small-ar2d-v2/final",
    seed=6,
    steps=1000,
    lr=1e-4,
    warmup=20,
    eval_every=500,
    distill_data="runs/distill2/self5000.jsonl",
    certainty_weight=2.0,
)

# the v2 AR twin, for the honest comparison: stage 1 continued on stage 2's data stream (same seed,
# same steps), so it has seen as many tokens as the diffusion model and its parent
V2_TWIN = dataclasses.replace(
    V2_STAGE2, out="runs/small-ar-v2-twin", objective="ar", logit_shift=False, lr=1e-4
)

# ... continued for stage 3's 1,000 steps (its seed, lr and schedule, fresh data), so the twin has
# seen as many steps as a stage-3 model and its parents: assets/model-ar, and the start of v3
V2_TWIN6K = dataclasses.replace(
    V2_STAGE3,
    out="runs/small-ar-v2-twin6k",
    init_from="runs/small-ar-v2-twin/final",
    objective="ar",
    logit_shift=False,
    distill_data="",
    certainty_weight=0.0,
)

# v3, the joint network (TiDAR / I-DLM): the v2 AR twin trained to draft k masked positions per
# pass on its own causal stream (objective ar_draft), the next-token loss kept beside the
# masked-token loss (weight 0.3) so that its AR mode stays the twin's
V3_DRAFT = TrainConfig(
    out="runs/small-ar-draft-w03-full",
    objective="ar_draft",
    init_from="runs/small-ar-v2-twin6k/final",
    max_seq_len=1024,
    max_len=1000,
    tasks=V2_MIX,
    seed=10,
    steps=1200,
    lr=2e-4,
    warmup=20,
    eval_every=600,
    cpu_bf16=True,
    draft_weight=0.3,
)

# the chain of cosine cycles at lr 1e-4, each from the previous run's final weights
V3_MORE = then(V3_DRAFT, "small-ar-draft-more", 11, steps=600, lr=1e-4)
V3_MORE2 = then(V3_MORE, "small-ar-draft-more2", 12, steps=900, eval_every=900)
V3_MORE3 = then(V3_MORE2, "small-ar-draft-more3", 13, steps=1500, eval_every=1500)
V3_MORE4 = then(V3_MORE3, "small-ar-draft-more4", 14)
V3_MORE5 = then(V3_MORE4, "small-ar-draft-more5", 15, steps=2400, eval_every=2400)
V3_MORE6 = then(V3_MORE5, "small-ar-draft-more6", 16)
V3_MORE7 = then(V3_MORE6, "small-ar-draft-more7", 17, steps=1200, eval_every=1200)
V3_MORE8 = then(V3_MORE7, "small-ar-draft-more8", 18)
# blocks sized for the decode k: every mask block 7-9 positions (k = 8 ± 1), 8 blocks a sequence
V3_K8 = then(V3_MORE8, "small-ar-draft-k8", 19, draft_spread=1, draft_blocks=8)
# sequence-level self-distillation of the drafts: half the examples are -k8's own verified greedy
# replies (the verifier keeps the model's own output, so drafts trained on it are the ones it
# accepts): v3.8, assets/model
V3_SD = then(
    V3_K8, "small-ar-draft-sd", 21, distill_data="runs/distill3/self_v37.jsonl", distill_frac=0.5
)

# v4 (in training, train/reproduce.py NEXT): v3.8 taught to apply and predict edits and to call
# tools it has never seen. Copying a 300-token file is a skill the v2 mixture never asked for, and
# edit data alone does not grow it (docs/LOG.md, 2026-12-06): the shipped models score 0 of 16 and
# ~11 nats a token on apply_edit's answers, and 1,500 steps on a stream mostly of edits at lr 5e-4
# left teacher-forced accuracy at ~0.7 with no copying. A drill does: on copy_short alone (random
# text, only copying predicts it) the copy loss drops from 2.3 to 0.05 nats between steps 450 and
# 800 at lr 1e-3, and then copy_text (long files) is learned in ~30 steps. So: the drill (short,
# then long), then the edit tasks beside the v2 mixture at lr 5e-4 (the copy stage), code files to
# copy (the code stages) and made-up names (the names stage) at 3e-4, then the first run's mixture
# (and a little of the made-up names) at 2e-4 (the edit stage).
V4_COPY_MIX = V2_MIX + ",apply_edit:4,next_edit:3,tool_open:2,copy_text:1"
V4_MIX = V2_MIX + ",apply_edit:1.5,next_edit:1.2,tool_open:1"
V4_EVAL = "apply_edit,next_edit,tool_open,tool_call,countdown3"
V4_DRILL = then(
    V3_SD,
    "small-ar-draft-drill",
    24,
    tasks="copy_short:1",
    distill_data="",
    steps=1000,
    lr=1e-3,
    warmup=20,
    eval_every=1000,
    eval_tasks="copy_short,copy_text",
    eval_limit=16,
)
V4_DRILL_LONG = then(
    V4_DRILL,
    "small-ar-draft-drill-long",
    25,
    tasks="copy_short:1,copy_text:2",
    batch_size=16,
    steps=200,
)
V4_COPY = then(
    V4_DRILL_LONG,
    "small-ar-draft-copy",
    22,
    tasks=V4_COPY_MIX,
    batch_size=16,
    steps=1500,
    lr=5e-4,
    eval_every=750,
    eval_tasks=V4_EVAL,
)
# the copy stage's model still misplaces its copy where the last token or two recur in the file
# (~3 wrong tokens a file teacher-forced): copy_code (generated code to copy unchanged) beside the
# copy stage's stream brings that down (docs/LOG.md, 2026-12-06, third sitting)
V4_CODE_MIX = V4_COPY_MIX + ",copy_code:4"
V4_CODE = then(
    V4_COPY,
    "small-ar-draft-code",
    31,
    tasks=V4_CODE_MIX,
    steps=400,
    lr=3e-4,
    warmup=20,
    eval_every=400,
    eval_tasks="apply_edit,copy_code,next_edit",
)
V4_CODE_MORE = then(V4_CODE, "small-ar-draft-code2", 33, steps=600, eval_every=600)
# the code2 model copies the training lexicon's names but not others: held-out apply_edit items
# whose only new feature is the held-out words make ~11 wrong tokens a file teacher-forced, those
# with a new indentation or gap 1-2 (docs/LOG.md, 2026-12-06, fourth sitting); the same tasks over
# made-up names (``*_made_up``) leave the name to the pointer alone
V4_NAMES_MIX = V4_CODE_MIX + ",apply_edit_made_up:3,next_edit_made_up:2,copy_code_made_up:3"
V4_NAMES = then(
    V4_CODE_MORE,
    "small-ar-draft-names",
    35,
    tasks=V4_NAMES_MIX,
    steps=600,
    eval_every=300,
    eval_tasks="apply_edit,apply_edit_made_up,copy_code_made_up,next_edit",
)
V4_EDIT = then(
    V4_NAMES,
    "small-ar-draft-edit",
    23,
    tasks=V4_MIX + ",apply_edit_made_up:0.75,copy_code_made_up:0.5",
    batch_size=32,
    steps=1200,
    lr=2e-4,
    eval_every=600,
    eval_tasks=V4_EVAL + ",multiply,fim,apply_edit_made_up",
)
# the edit stage's model has the v2 tasks' formats but not their arithmetic (multiply 0.01, fim
# 0.05 of 200; it copies digits from its context where it should compute them): a longer stage
# with a quarter of the examples on edits (docs/LOG.md, 2026-12-06, fourth sitting)
V4_RESTORE_MIX = V2_MIX + ",apply_edit:0.8,next_edit:0.6,tool_open:0.5"
V4_RESTORE = then(
    V4_EDIT,
    "small-ar-draft-restore",
    41,
    tasks=V4_RESTORE_MIX + ",apply_edit_made_up:0.4,copy_code_made_up:0.2",
    steps=1500,
    eval_every=750,
    eval_tasks=V4_EVAL + ",multiply,fim,sudoku4,apply_edit_made_up",
)

# the drill on copy_short alone (lr 1e-3) grows the copy but wipes what ships: multiply 0.875 -> 0,
# fim 0.69 -> 0 on 32 items, and no later stage brings arithmetic back (restore at step 750:
# multiply 0.03); halfway between the shipped and the edit stage's weights scores 0 on every task
# (docs/LOG.md, 2026-12-06, fifth sitting). So the drill again with the v2 mixture replayed as half
# the examples, to learn the copy without forgetting
V5_DRILL = dataclasses.replace(
    V4_DRILL,
    out="runs/small-ar-draft-drill-mix",
    seed=51,
    tasks=V2_MIX + ",copy_short:6.9",
    steps=1500,
    eval_every=500,
    eval_tasks="copy_short,copy_text,multiply,fim,countdown3",
)
# then every edit and copy task of v4 at once beside the same replayed mixture (the v4 chain's five
# stages in one), at the code stages' lr
V5_EDIT_MIX = (
    V2_MIX
    + ",apply_edit:1.5,next_edit:1.2,tool_open:1,copy_text:0.5,copy_code:1"
    + ",apply_edit_made_up:1,next_edit_made_up:0.5,copy_code_made_up:1"
)
V5_EDIT = then(
    V5_DRILL,
    "small-ar-draft-edit5",
    52,
    tasks=V5_EDIT_MIX,
    batch_size=16,
    steps=1500,
    lr=3e-4,
    eval_every=750,
    eval_tasks=V4_EVAL + ",multiply,fim,copy_code",
)
# v5's edit stage merges almost nothing after 1,500 steps (v4 needed ~4,300 past its drill): the
# same mixture, 3,000 steps more, says whether replay only slows the edits or blocks them
V5_EDIT_MORE = then(V5_EDIT, "small-ar-draft-edit5-more", 53, steps=3000, eval_every=1000)


def twin_of(joint: TrainConfig, out: str, init_from: str) -> TrainConfig:
    """The AR twin of a joint-model run: the same stream (seed, steps, schedule), objective ar."""
    return dataclasses.replace(
        joint,
        out=out,
        init_from=init_from,
        objective="ar",
        draft_weight=1.0,
        draft_spread=V2_TWIN6K.draft_spread,
        draft_blocks=V2_TWIN6K.draft_blocks,
    )


# their AR twins: the shipped twin continued on the same streams
V4_DRILL_TWIN = twin_of(V4_DRILL, "runs/small-ar-twin-drill", "runs/small-ar-v2-twin6k/final")
V4_DRILL_LONG_TWIN = twin_of(
    V4_DRILL_LONG, "runs/small-ar-twin-drill-long", "runs/small-ar-twin-drill/final"
)
V4_COPY_TWIN = twin_of(V4_COPY, "runs/small-ar-twin-copy", "runs/small-ar-twin-drill-long/final")
V4_CODE_TWIN = twin_of(V4_CODE, "runs/small-ar-twin-code", "runs/small-ar-twin-copy/final")
V4_CODE_MORE_TWIN = twin_of(
    V4_CODE_MORE, "runs/small-ar-twin-code2", "runs/small-ar-twin-code/final"
)
V4_NAMES_TWIN = twin_of(V4_NAMES, "runs/small-ar-twin-names", "runs/small-ar-twin-code2/final")
V4_EDIT_TWIN = twin_of(V4_EDIT, "runs/small-ar-twin-edit", "runs/small-ar-twin-names/final")
V4_TWIN = twin_of(V4_RESTORE, "runs/small-ar-twin-restore", "runs/small-ar-twin-edit/final")
V5_DRILL_TWIN = twin_of(V5_DRILL, "runs/small-ar-twin-drill-mix", "runs/small-ar-v2-twin6k/final")
V5_EDIT_TWIN = twin_of(V5_EDIT, "runs/small-ar-twin-edit5", "runs/small-ar-twin-drill-mix/final")

RECIPES: dict[str, TrainConfig] = {
    # block-causal diffusion from scratch, ~3.0M parameters (the CLI's default recipe)
    "small": TrainConfig(out="runs/small"),
    "small-ar": SMALL_AR,
    "small-ar-v2": V2_STAGE1,
    "small-ar2d-v2": V2_STAGE2,
    "small-ar2d-v2-sdcf": V2_STAGE3,
    "small-ar-v2-twin": V2_TWIN,
    "small-ar-v2-twin6k": V2_TWIN6K,
    **{
        c.out.removeprefix("runs/"): c
        for c in (V3_DRAFT, V3_MORE, V3_MORE2, V3_MORE3, V3_MORE4, V3_MORE5, V3_MORE6)
        + (
            V3_MORE7,
            V3_MORE8,
            V3_K8,
            V3_SD,
            V4_DRILL,
            V4_DRILL_LONG,
            V4_COPY,
            V4_CODE,
            V4_CODE_MORE,
            V4_NAMES,
            V4_EDIT,
            V4_RESTORE,
            V5_DRILL,
            V5_EDIT,
            V5_EDIT_MORE,
        )
        + (
            V4_DRILL_TWIN,
            V4_DRILL_LONG_TWIN,
            V4_COPY_TWIN,
            V4_CODE_TWIN,
            V4_CODE_MORE_TWIN,
            V4_NAMES_TWIN,
            V4_EDIT_TWIN,
            V4_TWIN,
            V5_DRILL_TWIN,
            V5_EDIT_TWIN,
        )
    },
    # a tiny run for tests and smoke checks (seconds)
    "tiny": TrainConfig(
        out="runs/tiny",
        d_model=64,
        n_layers=2,
        n_heads=2,
        mlp_hidden=172,
        vocab_size=384,
        tokenizer_texts=2000,
        batch_size=8,
        steps=20,
        warmup=2,
        eval_every=0,
        ckpt_every=10,
        log_every=5,
        tasks="path_star:1,sudoku4:1,multiply:1,fim:1",
        eval_tasks="sudoku4,fim",
        eval_limit=4,
    ),
}


def get_recipe(name: str, **overrides: Any) -> TrainConfig:
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of {sorted(RECIPES)}")
    return dataclasses.replace(RECIPES[name], **overrides).validate()
