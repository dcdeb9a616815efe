"""Sequence-level distillation data: a teacher's greedy replies to fresh training prompts, kept
where the task's exact verifier accepts them (``--keep all``: every reply, each marked ``correct``),
written as JSON lines the trainer mixes into batches.

Why: a parallel decoder commits many positions in one forward pass only where each is confident. A
generator's reference reply is one of several valid ones (countdown has many expressions, a sudoku
with many blanks several fillings), so a model trained on references spreads its belief over them —
the multi-modality that non-autoregressive translation cures by training on a teacher's outputs
(Kim & Rush 2016; Gu et al. 2018). A teacher's reply is one deterministic function of the prompt: the
AR twin's (``--teacher`` the AR checkpoint) or the diffusion model's own correct trajectories
(self-distillation, as dParallel and d3LLM distil their own decodes). A verify model's drafts are
kept when they match its own AR output, right or wrong, so its unverified replies can still train
the drafts: ``--keep all`` writes them marked, and the trainer gives them no next-token loss.

The file is written in chunks and resumes exactly: items come from a seeded stream, each line records
its chunk, and a rerun skips the chunks already written.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..pipeline import load
from ..suite.evaluate import decode_items
from ..suite.render import EOT, IM_END, prompt_text
from ..suite.tasks import TASKS, Item
from ..tokenizer import Tokenizer
from .data import Example, parse_weights

CHUNK = 32  # items decoded (and written) together
# which replies a file keeps: the ones the task's verifier accepts, or all (the drafts learn what the
# teacher decodes, right or wrong; only verified ones take the next-token loss, ``load_distilled``)
KEEP = ("verified", "all")


def item_stream(weights: dict[str, float], seed: int, instant_frac: float) -> Any:
    """Fresh training items from the weighted mixture: an endless seeded stream of (item, instant)."""
    rng = random.Random(f"distill/{seed}")
    names, w = list(weights), list(weights.values())
    while True:
        item = TASKS[rng.choices(names, w)[0]].sample(rng, "train")
        yield item, rng.random() < instant_frac


def chunks_done(path: Path) -> int:
    """How many chunks an earlier run wrote (0 for a new file)."""
    if not path.is_file():
        return 0
    last = -1
    with path.open() as f:
        for line in f:
            if line.strip():
                last = max(last, int(json.loads(line)["chunk"]))
    return last + 1


def example_record(
    item: Item, reply: str, tok: Tokenizer, instant: bool, chunk: int, correct: bool
) -> dict[str, Any]:
    """A kept reply as text (the student encodes it with its own tokenizer when it loads the file)."""
    return {
        "chunk": chunk,
        "task": item.task,
        "instant": instant,
        "chat": item.is_chat,
        "prompt": prompt_text(item, tok, instant),
        "reply": reply,
        "correct": correct,
    }


def distill(
    teacher: str | Path,
    out: Path,
    n: int,
    tasks: str,
    seed: int = 0,
    instant_frac: float = 0.15,
    batch_size: int = 16,
    keep: str = "verified",
) -> dict[str, Any]:
    """Decode ``n`` fresh training prompts with ``teacher`` (greedy) and append the replies the
    task's verifier accepts (``keep`` all: every reply, each marked) to ``out``; returns what was
    tried and kept per task, and how many the verifier accepted."""
    if n <= 0 or batch_size <= 0:
        raise ConfigError("--n and --batch-size must be positive")
    if keep not in KEEP:
        raise ConfigError(f"--keep must be one of {KEEP}, got {keep!r}")
    pipe = load(teacher)
    cfg = pipe.sampler_config(temperature=0.0)
    out.parent.mkdir(parents=True, exist_ok=True)
    stream = item_stream(parse_weights(tasks), seed, instant_frac)
    skip = chunks_done(out)
    tried: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    right: Counter[str] = Counter()
    with out.open("a") as f:
        for chunk in range(-(-n // CHUNK)):
            batch = [next(stream) for _ in range(min(CHUNK, n - chunk * CHUNK))]
            if chunk < skip:
                continue
            for instant in (False, True):
                items = [it for it, inst in batch if inst == instant]
                if not items:
                    continue
                for r in decode_items(
                    pipe.runtime, pipe.tokenizer, items, cfg, instant, batch_size
                ):
                    tried[r.item.task] += 1
                    right[r.item.task] += r.correct
                    if r.correct or keep == "all":
                        kept[r.item.task] += 1
                        rec = example_record(
                            r.item, r.reply, pipe.tokenizer, instant, chunk, r.correct
                        )
                        f.write(json.dumps(rec) + "\n")
            f.flush()
    return {
        "out": str(out),
        "teacher": str(teacher),
        "resumed_chunks": skip,
        "tried": dict(tried),
        "kept": dict(kept),
        "kept_frac": {k: round(kept[k] / v, 3) for k, v in tried.items()},
        "verified_frac": {k: round(right[k] / v, 3) for k, v in tried.items()},
    }


def load_distilled(
    path: str | Path, tok: Tokenizer, max_len: int | None = None, ar: bool = True
) -> list[Example]:
    """A distillation file's teacher replies as training examples in ``tok``'s ids: with a
    next-token loss where the verifier accepted the reply and ``ar`` is set, else drafts only."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"distillation data {p} not found (make it with `quicksilver distill`)")
    stops = {chat: tok.token_to_id(IM_END if chat else EOT) for chat in (True, False)}
    out = []
    with p.open() as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            stop = stops[bool(r["chat"])]
            assert stop is not None
            prompt, answer = tok.encode(r["prompt"]), tok.encode(r["reply"]) + [stop]
            if max_len is None or len(prompt) + len(answer) <= max_len:
                # files written before --keep all held verified replies only
                correct = r.get("correct", True)
                out.append(Example(prompt, answer, r["task"], ar and correct))
    if not out:
        raise ConfigError(f"distillation data {p} has no usable example")
    return out
