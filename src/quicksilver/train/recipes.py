"""``TrainConfig`` (every trainer option; CLI flags map 1:1 onto fields) and named recipes.

A recipe is a ``TrainConfig`` with chosen values; ``quicksilver train --recipe NAME --field value``
starts from the recipe and overrides single fields. The config is saved as JSON beside every
checkpoint, so any run can be reproduced from its directory.
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


# v2, stage 2: the finished stage-1 AR model adapted to block diffusion (as Dream / Fast-dLLM v2
# adapt finished AR models)
V2_STAGE2 = TrainConfig(
    out="runs/small-ar2d-v2",
    init_from="runs/small-ar-v2/final",
    logit_shift=True,
    max_seq_len=1024,
    max_len=1000,
    tasks=V2_MIX,
    seed=4,
    steps=1200,
    lr=2e-4,
    eval_every=600,
    cpu_bf16=True,  # from step 2800: 1.45x tokens/s on the EPYC's avx512_bf16 (docs/LOG.md)
)

# v2, stage 3: 1,000 steps from stage 2's final weights at lr 1e-4 (one schedule for every variant;
# distill_frac applies only where distill_data is set)
V2_STAGE3 = dataclasses.replace(
    V2_STAGE2,
    init_from="runs/small-ar2d-v2/final",
    seed=6,
    steps=1000,
    lr=1e-4,
    warmup=20,
    eval_every=500,
)

# v3: the AR twin of record (assets/model-ar until v3) trained with the ar_draft objective
V3_DRAFT = TrainConfig(
    out="runs/small-ar-draft",
    objective="ar_draft",
    init_from="runs/small-ar-v2-twin6k/final",
    max_seq_len=1024,
    max_len=1000,
    tasks=V2_MIX,
    seed=10,
    steps=1200,  # its first 600 steps ran on a 1500-step schedule (`make train-draft`)
    lr=2e-4,
    warmup=20,
    eval_every=600,
    cpu_bf16=True,
)

V3_DRAFT_MORE = dataclasses.replace(
    V3_DRAFT,
    init_from="runs/small-ar-draft-w03-full/final",
    draft_weight=0.3,
    seed=11,
    steps=600,
    lr=1e-4,
)

V3_DRAFT_MORE2 = dataclasses.replace(  # v3.1 (assets/model in the sixth sitting)
    V3_DRAFT_MORE, init_from="runs/small-ar-draft-more/final", seed=12, steps=900, eval_every=900
)

# v3.2, assets/model since the seventh sitting: tokens per pass had not flattened after 2,700 steps,
# so 1,500 more at weight 0.3
V3_DRAFT_MORE3 = dataclasses.replace(
    V3_DRAFT_MORE2,
    init_from="runs/small-ar-draft-more2/final",
    seed=13,
    steps=1500,
    eval_every=1500,
)

# lever (started in the seventh sitting, resumable): 1,500 more again — tokens per pass rose 0.17
# over the last 1,500 steps, and 3 over the templated suite is 0.02 away
V3_DRAFT_MORE4 = dataclasses.replace(
    V3_DRAFT_MORE3, init_from="runs/small-ar-draft-more3/final", seed=14
)

# lever (eighth sitting): 2,400 more on -more4 — tokens per pass rose 0.14 over its 1,500 steps and
# the held-out suite is 0.21 short of 3
V3_DRAFT_MORE5 = dataclasses.replace(
    V3_DRAFT_MORE4,
    init_from="runs/small-ar-draft-more4/final",
    seed=15,
    steps=2400,
    eval_every=2400,
)

# lever (ninth sitting): 2,400 more on -more5 — tokens per pass rose 0.18 over its 2,400 steps
# with accuracy rising too, and the held-out suite is 0.08 short of 3
V3_DRAFT_MORE6 = dataclasses.replace(
    V3_DRAFT_MORE5, init_from="runs/small-ar-draft-more5/final", seed=16
)

# lever (eleventh sitting): 1,200 more on -more6 (v3.5) — tokens per pass rose 0.14 over its 2,400
# steps, accuracy with them; half the steps fit one sitting beside the other work
V3_DRAFT_MORE7 = dataclasses.replace(
    V3_DRAFT_MORE6,
    init_from="runs/small-ar-draft-more6/final",
    seed=17,
    steps=1200,
    eval_every=1200,
)

# and 1,200 more on -more7 (the eleventh sitting, chained: a second cosine cycle, as -more5 -> -more6)
V3_DRAFT_MORE8 = dataclasses.replace(
    V3_DRAFT_MORE7, init_from="runs/small-ar-draft-more7/final", seed=18
)

# lever (twelfth sitting): blocks sized for the decode k — v3.6 (-more8) trained 1,200 steps more
# with every mask block 7-9 positions (k = 8 ± 1, was 4-12) and 8 blocks a sequence (was 6): the
# k = 4 ablation drafted 10% better at k = 4 with blocks sized for 4
V3_DRAFT_K8 = dataclasses.replace(
    V3_DRAFT_MORE8,
    init_from="runs/small-ar-draft-more8/final",
    seed=19,
    draft_spread=1,
    draft_blocks=8,
)

# and 1,200 more on -k8 (started at the end of the twelfth sitting, resumable): the sized blocks'
# one cycle gave +0.10 tokens per pass, more than the two plain cycles before it together
V3_DRAFT_K8_2 = dataclasses.replace(V3_DRAFT_K8, init_from="runs/small-ar-draft-k8/final", seed=20)

# lever (thirteenth sitting): sequence-level self-distillation of the drafts — v3.7 trained as -k8-2,
# with half its examples v3.7's own verified greedy replies (`make distill-v3-self`: 6,000 training
# prompts, seed 21). The verifier keeps the model's own output, not the data's: drafts trained on
# that output are the ones it accepts
V3_DRAFT_SD = dataclasses.replace(
    V3_DRAFT_K8_2,
    seed=21,
    distill_data="runs/distill3/self_v37.jsonl",
    distill_frac=0.5,
)

# and a second round (thirteenth sitting, resumable): v3.8 (-sd) on its own verified replies (`make
# distill-v3-self2`: 6,000 training prompts, seed 22) — the first round gave +0.09 / +0.11 tokens
# per pass, sized blocks alone +0.01 / +0.05
V3_DRAFT_SD2 = dataclasses.replace(
    V3_DRAFT_SD,
    init_from="runs/small-ar-draft-sd/final",
    seed=22,
    distill_data="runs/distill3/self_v38.jsonl",
)

# lever (fourteenth sitting): the drafts learn every reply the model decodes, the network's AR side
# only fresh data. v3.8 (-sd) on v3.8's own greedy replies, right or wrong (`make distill-v3-all`:
# 6,000 training prompts, seed 23, `--keep all`), with no next-token loss on any of them: the
# verifier accepts the model's output whether or not it is correct (path_star's replies are almost
# all wrong, so the verified-only files held none of them), while the AR loss on its own replies
# cost the second round a held-out point. Same start and steps as -sd2: the ablation of that choice
V3_DRAFT_SD3 = dataclasses.replace(
    V3_DRAFT_SD2,
    seed=23,
    distill_data="runs/distill3/all_v38.jsonl",
    distill_ar=False,
)

# and the same self-distillation from the other branch (fourteenth sitting): -k8-2 (v3.7 + 1,200
# steps of sized blocks, which drafts best on the bench's items) on its own verified replies (`make
# distill-k82-self`: 6,000 training prompts, seed 24)
V3_DRAFT_K82_SD = dataclasses.replace(
    V3_DRAFT_SD,
    init_from="runs/small-ar-draft-k8-2/final",
    seed=24,
    distill_data="runs/distill3/self_k82.jsonl",
)

RECIPES: dict[str, TrainConfig] = {
    # phase 1 (superseded): block-causal diffusion from scratch, ~3.0M parameters
    "small": TrainConfig(out="runs/small"),
    # the equal-size AR baseline: same network with a causal mask, same data stream and budget
    "small-ar": TrainConfig(out="runs/small-ar", objective="ar"),
    # the AR baseline adapted to block diffusion (as Dream / Fast-dLLM v2 adapt Qwen2.5): its step-2000
    # weights, the one-position logit shift, then 8000 block-diffusion steps on fresh data (seed 1) —
    # 10000 steps in all, the AR baseline's budget
    "small-ar2d": TrainConfig(
        out="runs/small-ar2d",
        init_from="runs/small-ar/step_2000",
        logit_shift=True,
        seed=1,
        steps=8000,
        lr=5e-4,
        cpu_bf16=True,
    ),
    # v2, stage 1: the v1 AR twin (shipped until 2026-12-01; `make runs/small-ar-v1` takes it from
    # git history) continued on natural phrasings and agent-loop turns with a 1,024-token context
    # (RoPE: the same weights serve the longer context)
    "small-ar-v2": TrainConfig(
        out="runs/small-ar-v2",
        objective="ar",
        init_from="runs/small-ar-v1",
        max_seq_len=1024,
        max_len=1000,
        tasks=V2_MIX,
        seed=3,
        steps=600,
        lr=3e-4,
        eval_every=500,
    ),
    "small-ar2d-v2": V2_STAGE2,
    # v2, stage 3: stage 2 continued with certainty forcing at the weight the pilot chose (docs/LOG.md:
    # from the shipped model, 400 steps, W = 0 / 0.5 / 2 / 5: TPF 1.87 / 1.99 / 2.18 / 2.32 at
    # accuracy 0.277 / 0.286 / 0.274 / 0.266); measured on stage 2 below its threshold frontier
    # (docs/LOG.md), kept as the record of that run, not a base for the next stage
    "small-ar2d-v2-cf": dataclasses.replace(
        V2_STAGE3, out="runs/small-ar2d-v2-cf", certainty_weight=2.0, seed=5
    ),
    # v2, stage 3 (distillation): half fresh data, half the AR twin's verified greedy replies (`make
    # distill-v2`: its step-3000 weights, 6000 training prompts, seed 7) — sequence-level distillation
    "small-ar2d-v2-kd": dataclasses.replace(
        V2_STAGE3, out="runs/small-ar2d-v2-kd", distill_data="runs/distill2/twin3000.jsonl"
    ),
    # ... its control: the same 1,000 steps on fresh reference data only
    "small-ar2d-v2-ctl": dataclasses.replace(V2_STAGE3, out="runs/small-ar2d-v2-ctl"),
    # ... and self-distillation (dParallel's recipe): stage 2's own verified replies (`make
    # distill-v2-self`: 3000 training prompts, seed 8) under certainty forcing (W = 2)
    "small-ar2d-v2-sdcf": dataclasses.replace(
        V2_STAGE3,
        out="runs/small-ar2d-v2-sdcf",
        distill_data="runs/distill2/self5000.jsonl",
        certainty_weight=2.0,
    ),
    # ... a second round: the shipped stage-3 model's own verified replies (`make distill-v2-self2`:
    # 3000 prompts, seed 9), the same 1,000 steps from its weights
    "small-ar2d-v2-sdcf2": dataclasses.replace(
        V2_STAGE3,
        out="runs/small-ar2d-v2-sdcf2",
        init_from="runs/small-ar2d-v2-sdcf/final",
        distill_data="runs/distill2/self_sdcf.jsonl",
        certainty_weight=2.0,
        seed=7,
    ),
    # v2, the AR twin for the honest comparison: stage 1 continued on stage 2's data stream (same
    # seed, same steps), so it has seen as many tokens as the diffusion model and its parent
    "small-ar-v2-twin": dataclasses.replace(
        V2_STAGE2, out="runs/small-ar-v2-twin", objective="ar", logit_shift=False, lr=1e-4
    ),
    # ... continued for stage 3's 1,000 steps (its seed, lr and schedule, fresh data), so the twin
    # has seen as many steps as a stage-3 model and its parents
    "small-ar-v2-twin6k": dataclasses.replace(
        V2_STAGE3,
        out="runs/small-ar-v2-twin6k",
        init_from="runs/small-ar-v2-twin/final",
        objective="ar",
        logit_shift=False,
    ),
    # v3, the joint network (TiDAR / I-DLM): the finished AR twin (`make runs/small-ar-v2-twin6k`
    # takes it from git history) trained to draft k masked positions per pass on its own causal
    # stream, next-token loss kept beside the masked-token loss so its AR mode stays the twin's
    "small-ar-draft": V3_DRAFT,
    # ablations (fewer steps, the same schedule shape): the draft loss weight and the block size
    "small-ar-draft-w03": dataclasses.replace(
        V3_DRAFT, out="runs/small-ar-draft-w03", draft_weight=0.3, steps=250
    ),
    "small-ar-draft-w1s": dataclasses.replace(V3_DRAFT, out="runs/small-ar-draft-w1s", steps=250),
    "small-ar-draft-k4": dataclasses.replace(
        V3_DRAFT, out="runs/small-ar-draft-k4", draft_len=4, draft_blocks=10, steps=250
    ),
    # the ablation's winner at full length: draft weight 0.3, at v3's and at half its learning rate
    "small-ar-draft-w03-full": dataclasses.replace(
        V3_DRAFT, out="runs/small-ar-draft-w03-full", draft_weight=0.3
    ),
    "small-ar-draft-w03-lr1": dataclasses.replace(
        V3_DRAFT, out="runs/small-ar-draft-w03-lr1", draft_weight=0.3, lr=1e-4
    ),
    # 600 more steps from w03-full: drafts trained on the stream's own logits, and the control
    "small-ar-draft-self": dataclasses.replace(
        V3_DRAFT_MORE, out="runs/small-ar-draft-self", draft_teacher="self"
    ),
    "small-ar-draft-more": dataclasses.replace(V3_DRAFT_MORE, out="runs/small-ar-draft-more"),
    # 900 more from -more: the same recipe, and the draft weight back at 1 (the lever on drafts)
    "small-ar-draft-more2": dataclasses.replace(V3_DRAFT_MORE2, out="runs/small-ar-draft-more2"),
    "small-ar-draft-more3": dataclasses.replace(V3_DRAFT_MORE3, out="runs/small-ar-draft-more3"),
    "small-ar-draft-more4": dataclasses.replace(V3_DRAFT_MORE4, out="runs/small-ar-draft-more4"),
    "small-ar-draft-more5": dataclasses.replace(V3_DRAFT_MORE5, out="runs/small-ar-draft-more5"),
    "small-ar-draft-more6": dataclasses.replace(V3_DRAFT_MORE6, out="runs/small-ar-draft-more6"),
    "small-ar-draft-more7": dataclasses.replace(V3_DRAFT_MORE7, out="runs/small-ar-draft-more7"),
    "small-ar-draft-more8": dataclasses.replace(V3_DRAFT_MORE8, out="runs/small-ar-draft-more8"),
    "small-ar-draft-k8": dataclasses.replace(V3_DRAFT_K8, out="runs/small-ar-draft-k8"),
    "small-ar-draft-k8-2": dataclasses.replace(V3_DRAFT_K8_2, out="runs/small-ar-draft-k8-2"),
    "small-ar-draft-sd": dataclasses.replace(V3_DRAFT_SD, out="runs/small-ar-draft-sd"),
    "small-ar-draft-sd2": dataclasses.replace(V3_DRAFT_SD2, out="runs/small-ar-draft-sd2"),
    "small-ar-draft-sd3": dataclasses.replace(V3_DRAFT_SD3, out="runs/small-ar-draft-sd3"),
    "small-ar-draft-k82-sd": dataclasses.replace(V3_DRAFT_K82_SD, out="runs/small-ar-draft-k82-sd"),
    "small-ar-draft-more-w1": dataclasses.replace(
        V3_DRAFT_MORE2, out="runs/small-ar-draft-more-w1", draft_weight=1.0
    ),
    # ablation: no substitution noise
    "small-nosub": TrainConfig(out="runs/small-nosub", sub_prob=0.0),
    # a bidirectional (LLaDA-style) chat model: measures what the approximate prefix/dual caches cost
    "chat-bidir": TrainConfig(
        out="runs/chat-bidir",
        objective="mdm",
        tasks="chat:1",
        eval_tasks="chat",
        steps=1500,
        eval_every=500,
    ),
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
