"""What every task of the suite shares: the ``Item`` a generator yields, the ``Task`` interface, and
the helpers that make train/test splits disjoint by rule.

An item is one assistant turn to produce: the conversation before it (``messages`` + ``tools``,
rendered through the model's chat template) or a raw prompt (fill-in-the-middle), the working
(``reasoning``, put between ``<think>`` and ``</think>``) and the ``answer``. ``Task.verify`` checks a
generated reply with an exact verifier — a constraint checker where several answers are valid —
never by string match against the reference when other answers would also be right.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

from .phrasing import PHRASINGS

SPLITS = ("train", "test")


@dataclass
class Item:
    """One generated example: the prompt, the target reply, and what the verifier needs."""

    task: str
    messages: list[dict[str, Any]] | None  # chat prompt (None for raw prompts)
    answer: str  # the reply after the reasoning segment
    reasoning: str = ""  # working, rendered as <think>reasoning</think> before the answer
    tools: list[dict[str, Any]] | None = None
    raw_prompt: str | None = None  # a prompt used verbatim (fill-in-the-middle)
    stratum: str = "all"
    data: dict[str, Any] = field(default_factory=dict)  # whatever the verifier needs

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


class Task:
    """A seeded generator with a rule-based split, difficulty strata and an exact verifier."""

    name: str = ""
    strata: tuple[str, ...] = ("all",)
    max_answer_tokens: int = 64  # canvas to give the decoder at evaluation time
    uses_reasoning: bool = False  # does the working in <think> help here?

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:  # pragma: no cover - interface
        """One item drawn from ``rng``. Its request's wording is drawn from ``wording`` (default:
        ``rng``): training items mix the canonical wording with train-only templates; test items use
        the canonical one (``templated``) or test-only templates (``held-out``), see phrasing.py."""
        raise NotImplementedError

    def verify(self, item: Item, reply: str) -> bool:  # pragma: no cover - interface
        """True when ``reply`` (the answer text, reasoning already stripped) solves the item."""
        raise NotImplementedError

    def test_items(self, n: int, seed: int = 1234, phrasing: str = "templated") -> list[Item]:
        """The fixed held-out test split: the first ``n`` items of a seeded test stream, worded
        canonically (``templated``) or with phrasing templates never seen in training (``held-out``).
        Both streams draw the same puzzles: only the wording differs."""

        if phrasing not in PHRASINGS:
            raise ValueError(f"phrasing must be one of {PHRASINGS}, got {phrasing!r}")
        rng = random.Random(f"{self.name}/test/{seed}")
        wording = random.Random(f"{self.name}/wording/{seed}")
        return [self.sample(rng, "test", phrasing, wording) for _ in range(n)]


def stable_hash(*parts: Any) -> int:
    """A hash that does not change between runs (Python's ``hash`` is salted)."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def held_out(key: Any, percent: int = 10) -> bool:
    """The split rule: an item whose key hashes into the first ``percent`` buckets is test-only."""
    return stable_hash(key) % 100 < percent


def in_split(key: Any, split: str, percent: int = 10) -> bool:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return held_out(key, percent) == (split == "test")


THINK_RE = re.compile(r"^\s*<think>(.*?)</think>", re.S)


def split_reply(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a generated reply; an instant-mode reply has no think segment."""
    m = THINK_RE.match(text)
    if m:
        return m.group(1), text[m.end() :].strip()
    return "", text.strip()
