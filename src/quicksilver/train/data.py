"""From task items to training tensors: the task mixture, the tokenizer trained on generated text,
and padded batches laid out on absolute block boundaries.

An example is ``prompt ids + answer ids`` as ``suite.render`` renders them, then ``<|endoftext|>``
pads up to the end of the block the answer ends in, so the model learns where answers stop.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..suite.render import answer_text, prompt_text, render
from ..suite.tasks import TASKS, get_task
from ..tokenizer import Tokenizer


def corpus(n: int, seed: int = 0) -> Iterator[str]:
    """Generated training text for the tokenizer (both splits' formats, train split only)."""
    rng = random.Random(seed)
    base = Tokenizer.byte_level()
    names = [t for t in TASKS]
    for _ in range(n):
        item = TASKS[rng.choice(names)].sample(rng, "train")
        yield prompt_text(item, base, False) + answer_text(item, False)


@functools.lru_cache(maxsize=4)
def build_tokenizer(vocab_size: int, n_texts: int = 20000, seed: int = 0) -> Tokenizer:
    """Byte-level BPE with individual digits, trained on generated text of every task (a pure
    function of its arguments, built once per process: the training takes seconds)."""
    return Tokenizer.byte_level(
        merges_from=corpus(n_texts, seed), vocab_size=vocab_size, individual_digits=True
    )


def parse_weights(spec: str) -> dict[str, float]:
    """``"path_star:1,sudoku4:2"`` -> {"path_star": 1.0, "sudoku4": 2.0} (tasks checked)."""
    out: dict[str, float] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, w = part.partition(":")
        get_task(name.strip())
        try:
            out[name.strip()] = float(w) if w else 1.0
        except ValueError:
            raise ConfigError(f"bad task weight {part!r} (expected NAME:WEIGHT)") from None
    if not out or any(v < 0 for v in out.values()) or sum(out.values()) <= 0:
        raise ConfigError(f"task mixture {spec!r} has no positive weight")
    return out


@dataclass
class Example:
    prompt: list[int]
    answer: list[int]
    task: str
    # next-token loss on it; False: the draft loss only (a teacher's unverified reply)
    ar: bool = True


class Mixture:
    """Fresh examples from weighted tasks (and, with ``distill_frac``, a teacher's verified replies);
    deterministic given the rng."""

    def __init__(
        self,
        weights: dict[str, float],
        tokenizer: Tokenizer,
        instant_frac: float = 0.15,
        max_len: int | None = None,
        distilled: list[Example] | None = None,
        distill_frac: float = 0.0,
    ) -> None:
        self.distilled = distilled or []  # a teacher's verified replies (distill.py)
        self.distill_frac = distill_frac
        self.names = list(weights)
        self.weights = [weights[n] for n in self.names]
        self.tokenizer = tokenizer
        self.instant_frac = instant_frac
        self.max_len = max_len

    def sample(self, rng: random.Random) -> Example:
        if self.distilled and rng.random() < self.distill_frac:
            return rng.choice(self.distilled)
        while True:
            name = rng.choices(self.names, self.weights)[0]
            item = TASKS[name].sample(rng, "train")
            p, a = render(item, self.tokenizer, instant=rng.random() < self.instant_frac)
            if self.max_len is None or len(p) + len(a) <= self.max_len:
                return Example(p, a, name)


@dataclass
class Batch:
    """Examples padded to a common length: ids (B, L), answer mask (B, L), prompt lengths (B,)."""

    ids: torch.Tensor  # (B, L) long
    answer: torch.Tensor  # (B, L) bool: answer tokens incl. the stop token and trailing pads
    valid: torch.Tensor  # (B, L) bool: real (non-batch-padding) positions
    prompt_len: torch.Tensor  # (B,) long
    content_len: torch.Tensor  # (B,) long: prompt + answer up to and including the stop token
    n_tokens: int  # data tokens in the batch (the budget's unit)
    ar_rows: torch.Tensor  # (B,) bool: rows with a next-token loss (``Example.ar``)


def collate(
    examples: list[Example], block_size: int, pad_id: int, eot_id: int, pad_answers: bool = True
) -> Batch:
    """Lay out examples; with ``pad_answers`` each answer is filled with ``eot_id`` to its block's end."""
    lens = []
    for ex in examples:
        n = len(ex.prompt) + len(ex.answer)
        lens.append(-(-n // block_size) * block_size if pad_answers else n)
    L, B = max(lens), len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    answer = torch.zeros((B, L), dtype=torch.bool)
    valid = torch.zeros((B, L), dtype=torch.bool)
    plen = torch.zeros(B, dtype=torch.long)
    clen = torch.zeros(B, dtype=torch.long)
    for i, (ex, n) in enumerate(zip(examples, lens)):
        P, A = len(ex.prompt), len(ex.answer)
        ids[i, :P] = torch.tensor(ex.prompt)
        ids[i, P : P + A] = torch.tensor(ex.answer)
        ids[i, P + A : n] = eot_id
        answer[i, P:n] = True
        valid[i, :n] = True
        plen[i], clen[i] = P, P + A
    ar_rows = torch.tensor([ex.ar for ex in examples])  # (B,)
    return Batch(ids, answer, valid, plen, clen, int(sum(lens)), ar_rows)
