"""``TrainConfig`` (every trainer option; CLI flags map 1:1 onto fields) and named recipes.

A recipe is a ``TrainConfig`` with chosen values; ``quicksilver train --recipe NAME --field value``
starts from the recipe and overrides single fields. The config is saved as JSON beside every
checkpoint, so any run can be reproduced from its directory. The recipes here are the runs that lead
to the shipped models and to the edit model, ``quicksilver-edit`` (plus the CLI's default and a tiny
one for tests); ``train/reproduce.py`` runs them in order with the schedules they ran (``make
train``). Experiments that ship nothing are not kept here: their configs and results are in
docs/LOG.md and git's history.
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
    # run directory: checkpoints, metrics.jsonl, the final model in out/final
    out: str = "runs/default"
    # diffusion | diffusion_single | ar (the equal-size causal baseline)
    objective: str = "diffusion"
    # model
    d_model: int = 192
    n_layers: int = 6
    n_heads: int = 4
    mlp_hidden: int = 512
    block_size: int = 32
    # position p predicted from p - 1 (Dream / Fast-dLLM v2; keeps an AR init's head)
    logit_shift: bool = False
    # start from this checkpoint's weights and tokenizer (e.g. adapt the AR baseline)
    init_from: str = ""
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
    # block sizes drawn from draft_len ± this (None: ± draft_len // 2)
    draft_spread: int | None = None
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
    # bf16 autocast on CPU too (AMX / avx512_bf16 matmuls: ~1.5x tokens/s, docs/LOG.md)
    cpu_bf16: bool = False
    # bookkeeping
    eval_every: int = 300  # steps between held-out evaluations (0: never)
    eval_tasks: str = DEFAULT_EVAL
    eval_limit: int = 24  # held-out items per task at each evaluation
    ckpt_every: int = 100  # steps between resumable checkpoints
    log_every: int = 10
    time_limit: float = 0.0  # stop (and save) after this many seconds (0: no limit)
    # stop (and save) at this step, schedule unchanged; resume later (0: run to the end)
    stop_at: int = 0
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

# quicksilver-edit (assets/model-edit, in training): a second network of the default's shape for the
# apply and next-edit routes only, as Mercury Edit ships beside Mercury 2. In one 3.0M network the copy
# of long files and the suite's arithmetic compete (docs/LOG.md, 2026-12-06: v4 learned edits and lost
# multiply, v5 replayed the v2 mixture and learned no edits), so this line replays none of it. From
# v3.8's weights and tokenizer: the drill (copy_short alone at lr 1e-3; the copy circuit forms in a
# ~200-step drop, at 210-300 in v4's drill from the same weights), the drill on long files, a copy
# stage on code files (and apply_edit, so that the snippet's changes are not dropped for the
# original), then the edit stage: apply_edit, next_edit, fim and the code copies, over the lexicon's
# names and made-up ones
EDIT_EVAL = "apply_edit,apply_edit_made_up,next_edit,next_edit_made_up,copy_code,fim"
EDIT_DRILL = then(
    V3_SD,
    "edit-drill",
    61,
    tasks="copy_short:1",
    distill_data="",
    steps=800,
    lr=1e-3,
    warmup=20,
    eval_every=400,
    eval_tasks="copy_short,copy_text",
    eval_limit=16,
)
EDIT_DRILL_LONG = then(
    EDIT_DRILL,
    "edit-drill-long",
    62,
    tasks="copy_short:1,copy_text:2",
    batch_size=16,
    steps=200,
    eval_every=200,
)
EDIT_COPY = then(
    EDIT_DRILL_LONG,
    "edit-copy",
    63,
    tasks="copy_text:1,copy_code:3,copy_code_made_up:3,apply_edit:2,apply_edit_made_up:1",
    steps=800,
    lr=5e-4,
    eval_every=400,
    eval_tasks="copy_code,copy_code_made_up,apply_edit,apply_edit_made_up",
)
EDIT_MIX = (
    "apply_edit:3,apply_edit_made_up:2,next_edit:2,next_edit_made_up:1.5,"
    "copy_code:1,copy_code_made_up:1,copy_text:0.3,fim:2"
)
EDIT = then(
    EDIT_COPY,
    "edit",
    64,
    tasks=EDIT_MIX,
    steps=600,
    lr=3e-4,
    eval_every=300,
    eval_tasks=EDIT_EVAL,
)


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
            EDIT_DRILL,
            EDIT_DRILL_LONG,
            EDIT_COPY,
            EDIT,
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
