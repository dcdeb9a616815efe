"""The trainer: fresh generated data every batch, AdamW with warm-up + cosine, gradient clipping,
periodic held-out evaluation, resumable checkpoints, deterministic seeds, ``torchrun`` data
parallelism (gloo on CPU, nccl on GPU) and bf16 autocast on a GPU.

Run directory (``TrainConfig.out``): ``ckpt.pt`` (resumable state: model, optimiser, step, data and
noise generator states), ``metrics.jsonl`` (one JSON object per log line or evaluation),
``tokenizer/``, ``step_N/`` (exported model directories at every evaluation, for learning curves)
and ``final/`` (the finished model, in the checkpoint format ``quicksilver.load`` reads).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..models.checkpoint import read_safetensors, save_checkpoint
from ..models.config import ModelConfig
from ..models.transformer import Transformer
from ..sampling import SamplerConfig
from ..suite.evaluate import evaluate
from ..tokenizer import Tokenizer
from .data import Mixture, build_tokenizer, collate, parse_weights
from .distill import load_distilled
from .objective import OBJECTIVES, NoiseConfig
from .recipes import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_frac * lr`` at ``cfg.steps``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def model_config(cfg: TrainConfig, tok: Tokenizer) -> ModelConfig:
    attention = OBJECTIVES[cfg.objective][1]
    assert tok.mask_id is not None and tok.eos_id is not None
    stops = sorted({tok.eos_id, *tok.stop_ids})
    return ModelConfig(
        vocab_size=-(-tok.vocab_size // 64) * 64,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_heads,
        mlp_hidden=cfg.mlp_hidden,
        max_seq_len=cfg.max_seq_len,
        attention=attention,
        block_size=cfg.block_size,
        logit_shift=cfg.logit_shift,
        mask_token_id=tok.mask_id,
        eos_token_ids=stops,
        pad_token_id=tok.pad_id,
        draft_length=cfg.draft_len if cfg.objective == "ar_draft" else 0,
    )


class Dist:
    """Rank and world size; a no-op outside ``torchrun``."""

    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def sum(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())


def load_or_build_tokenizer(cfg: TrainConfig, out: Path, d: Dist) -> Tokenizer:
    tdir = out / "tokenizer"
    if d.main and not (tdir / "tokenizer.json").is_file():
        tdir.mkdir(parents=True, exist_ok=True)
        if cfg.init_from:  # the initial weights' vocabulary
            Tokenizer.from_dir(cfg.init_from).save(tdir)
        else:
            build_tokenizer(cfg.vocab_size, cfg.tokenizer_texts, cfg.seed).save(tdir)
    d.barrier()
    return Tokenizer.from_dir(tdir)


class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg.validate()
        self.d = Dist()
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device(
            f"cuda:{self.d.rank % torch.cuda.device_count()}"
            if torch.cuda.is_available()
            else "cpu"
        )
        self.out = Path(cfg.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.tok = load_or_build_tokenizer(cfg, self.out, self.d)
        torch.manual_seed(cfg.seed)
        self.model = Transformer(model_config(cfg, self.tok)).to(self.device)
        if cfg.init_from and not (cfg.resume and (self.out / "ckpt.pt").is_file()):
            self.init_weights(Path(cfg.init_from))
        self.loss_fn, _, self.pad_answers = OBJECTIVES[cfg.objective]
        self.noise = NoiseConfig(
            self.model.config.mask_token_id,
            cfg.block_size,
            cfg.eps,
            cfg.sub_prob,
            cfg.sub_weight,
            cfg.keep_weight,
            cfg.certainty_weight,
            cfg.draft_len,
            cfg.draft_blocks,
            draft_weight=cfg.draft_weight,
            draft_teacher=cfg.draft_teacher,
            draft_spread=cfg.draft_spread,
        )
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        other = [p for p in self.model.parameters() if p.dim() < 2]
        self.opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.weight_decay},
                {"params": other, "weight_decay": 0.0},
            ],
            lr=cfg.lr,
            betas=(0.9, cfg.beta2),
        )
        self.ddp = (
            torch.nn.parallel.DistributedDataParallel(self.model)
            if self.d.world > 1
            else self.model
        )
        distilled = (
            load_distilled(cfg.distill_data, self.tok, cfg.max_len, cfg.distill_ar)
            if cfg.distill_data
            else None
        )
        self.mix = Mixture(
            parse_weights(cfg.tasks),
            self.tok,
            cfg.instant_frac,
            cfg.max_len,
            distilled,
            cfg.distill_frac,
        )
        self.rng = random.Random(f"data/{cfg.seed}/{self.d.rank}")
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + self.d.rank)
        self.stages: list[
            dict[str, Any]
        ] = []  # config changes at resumes (a run extended to more steps)
        self.queue: list[list[Any]] = []  # length-bucketed batches of examples still to train on
        self.step = 0
        self.tokens = 0  # data tokens consumed, all ranks
        self.fwd_tokens = 0
        self.elapsed = 0.0
        if cfg.resume and (self.out / "ckpt.pt").is_file():
            self.load_state(self.out / "ckpt.pt")

    def init_weights(self, path: Path) -> None:
        """Copy another checkpoint's weights (same shapes; its attention pattern and shift may differ:
        adapting an AR model to block diffusion, as Dream and Fast-dLLM v2 were made)."""

        state = read_safetensors(path)
        own = self.model.state_dict()
        bad = sorted(k for k in own if k not in state or state[k].shape != own[k].shape)
        if bad or set(state) - set(own):
            raise ConfigError(
                f"{path}: weights do not fit this model ({(bad or sorted(set(state) - set(own)))[:3]})"
            )
        self.model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})

    # ---- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "step": self.step,
            "tokens": self.tokens,
            "fwd_tokens": self.fwd_tokens,
            "elapsed": self.elapsed,
            "rng": self.rng.getstate(),
            "gen": self.gen.get_state(),
            "queue": self.queue,
            "stages": self.stages,
            "config": self.cfg.to_dict(),
        }

    def save_state(self) -> None:
        if self.d.world > 1:  # every rank's data stream position differs; keep one file per rank
            torch.save(self.state(), self.out / f"ckpt.rank{self.d.rank}.pt")
        if self.d.main:
            tmp = self.out / "ckpt.pt.tmp"
            torch.save(self.state(), tmp)
            tmp.replace(self.out / "ckpt.pt")

    def load_state(self, path: Path) -> None:
        if self.d.world > 1 and (self.out / f"ckpt.rank{self.d.rank}.pt").is_file():
            path = self.out / f"ckpt.rank{self.d.rank}.pt"
        s = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["opt"])
        self.step, self.tokens, self.fwd_tokens, self.elapsed = (
            s["step"],
            s["tokens"],
            s["fwd_tokens"],
            s["elapsed"],
        )
        self.rng.setstate(s["rng"])
        self.gen.set_state(s["gen"])
        self.queue = s["queue"]
        volatile = {
            "threads",
            "time_limit",
            "stop_at",
            "resume",
            "eval_every",
            "eval_limit",
            "log_every",
            "ckpt_every",
        }
        changed = {
            k: [s["config"].get(k), v]
            for k, v in self.cfg.to_dict().items()
            if k not in volatile and s["config"].get(k) != v
        }
        self.stages = s.get("stages", []) + (
            [{"step": self.step, "changed": changed}] if changed else []
        )

    def export(self, name: str) -> Path:
        extra = {
            "train_config": self.cfg.to_dict(),
            "train_state": {
                "step": self.step,
                "tokens": self.tokens,
                "fwd_tokens": self.fwd_tokens,
                "seconds": round(self.elapsed, 1),
                "stages": self.stages,
            },
        }
        return save_checkpoint(
            self.model, self.tok, self.out / name, dtype=self.cfg.save_dtype, extra=extra
        )

    def log(self, rec: dict[str, Any]) -> None:
        if self.d.main:
            with open(self.out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    # ---- one step ---------------------------------------------------------------------------------
    def next_examples(self) -> list[Any]:
        """The next batch: fresh examples, generated ``bucket`` batches at a time and grouped by length
        so that little compute goes to padding; the groups are trained in random order."""
        if not self.queue:
            per_rank = max(1, self.cfg.batch_size // self.d.world)
            pool = [self.mix.sample(self.rng) for _ in range(per_rank * self.cfg.bucket)]
            pool.sort(key=lambda e: len(e.prompt) + len(e.answer))
            self.queue = [pool[i : i + per_rank] for i in range(0, len(pool), per_rank)]
            self.rng.shuffle(self.queue)
        return self.queue.pop()

    def train_step(self) -> tuple[dict[str, float], int, int]:
        """One optimiser step: the loss and its named parts, data tokens, forward tokens."""
        cfg = self.cfg
        batch = collate(
            self.next_examples(),
            cfg.block_size,
            self.tok.pad_id or 0,
            self.tok.eos_id or 1,
            self.pad_answers,
        )
        if self.device.type != "cpu":
            for k in ("ids", "answer", "valid", "prompt_len", "content_len", "ar_rows"):
                setattr(batch, k, getattr(batch, k).to(self.device))
        lr = lr_at(self.step, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        bf16 = self.device.type == "cuda" or (cfg.cpu_bf16 and self.device.type == "cpu")
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=bf16):
            out = self.loss_fn(self.ddp, batch, self.noise, self.gen)  # type: ignore[arg-type]
        out.loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        parts = {k: float(v.item()) for k, v in (out.parts or {}).items()}
        return {"loss": float(out.loss.item()), **parts}, batch.n_tokens, out.forward_tokens

    def evaluate(self) -> dict[str, float]:
        tasks = [t.strip() for t in self.cfg.eval_tasks.split(",") if t.strip()]
        causal = self.model.config.attention == "causal"  # its AR output (and the drafts' TPF)
        sampler = SamplerConfig(policy="verify") if causal else SamplerConfig()
        rep = evaluate(self.model, self.tok, tasks, self.cfg.eval_limit, sampler)
        return {k: round(v["accuracy"], 4) for k, v in rep["tasks"].items()}

    def run(self) -> Path:
        cfg = self.cfg
        bar = None
        if self.d.main and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=self.step, desc=cfg.objective, dynamic_ncols=True)
        t_last, tok_last, fwd_last = time.perf_counter(), 0, 0
        losses: dict[str, list[float]] = {}
        start = time.perf_counter() - self.elapsed
        stopped = False
        while self.step < cfg.steps:
            loss, n, f = self.train_step()
            self.elapsed = time.perf_counter() - start
            self.tokens += int(self.d.sum(n))
            self.fwd_tokens += int(self.d.sum(f))
            tok_last, fwd_last = tok_last + n, fwd_last + f
            for k, v in loss.items():
                losses.setdefault(k, []).append(v)
            if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                dt = time.perf_counter() - t_last
                rec: dict[str, Any] = {
                    "step": self.step,
                    "tokens": self.tokens,
                    **{k: round(sum(v) / len(v), 4) for k, v in losses.items()},
                    "lr": lr_at(self.step - 1, cfg),
                    "tok_s": round(tok_last * self.d.world / dt),
                    "fwd_tok_s": round(fwd_last * self.d.world / dt),
                    "elapsed": round(self.elapsed, 1),
                }
                self.log(rec)
                if bar is not None:
                    bar.set_postfix(loss=rec["loss"], tok_s=rec["tok_s"])
                    bar.update(self.step - bar.n)
                elif self.d.main:
                    print(json.dumps(rec), flush=True)
                t_last, tok_last, fwd_last, losses = time.perf_counter(), 0, 0, {}
            if (cfg.time_limit and self.elapsed >= cfg.time_limit) or self.step == cfg.stop_at:
                stopped = True
            if self.step % cfg.ckpt_every == 0 or stopped:
                self.save_state()
            if (
                self.d.main
                and cfg.eval_every
                and (self.step % cfg.eval_every == 0 or self.step == cfg.steps)
            ):
                acc = self.evaluate()
                self.export(f"step_{self.step}")
                rec = {
                    "step": self.step,
                    "tokens": self.tokens,
                    "fwd_tokens": self.fwd_tokens,
                    "elapsed": round(self.elapsed, 1),
                    "eval": acc,
                }
                self.log(rec)
                print(json.dumps(rec), flush=True)
                # evaluation time is not training time
                start += time.perf_counter() - start - self.elapsed
                t_last = time.perf_counter()
            if stopped:
                break
        if bar is not None:
            bar.close()
        self.save_state()
        self.d.barrier()
        return self.export("final") if self.d.main else self.out / "final"


def train(cfg: TrainConfig) -> Path:
    return Trainer(cfg).run()
