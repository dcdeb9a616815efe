"""Many wordings per task request, with whole templates held out for the test split.

A user does not type a task generator's one template: they ask questions or give orders, in lower
case, with typos, extra words and other operator or grid notations. Every task therefore words its
request through ``Phrasings``: a canonical template (the one the ``templated`` test split keeps, so
figures stay comparable across versions), train-only templates, and test-only templates that no
training item ever uses (the ``held-out`` split). ``roughen`` adds surface noise to a template's
literal words only, never to the values filled into it, so every answer stays exactly verifiable.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

PHRASINGS = ("templated", "held-out")
CANONICAL_FRAC = 0.25  # share of training requests in the canonical wording
FIELD_RE = re.compile(r"(\{[A-Za-z_]+\})")  # a template's slots: values filled in later
WORD_RE = re.compile(r"[A-Za-z]{4,}")
PREFIXES = ("hey, ", "hi! ", "ok so ", "please ", "quick one: ", "hello. ", "hmm, ")
SUFFIXES = (" thanks", " thank you!", " pls", " :)", " asap", " (thanks in advance)")


def typo(rng: random.Random, text: str) -> str:
    """Swap two neighbouring letters of one word of four letters or more (if there is one)."""
    words = list(WORD_RE.finditer(text))
    if not words:
        return text
    m = rng.choice(words)
    i = rng.randrange(m.start(), m.end() - 1)
    return text[:i] + text[i + 1] + text[i] + text[i + 2 :]


def roughen(rng: random.Random, template: str) -> str:
    """The template with noise on its literal text: lower case, a typo, no final punctuation, a
    greeting before or a word after; ``{slots}`` are left untouched."""
    parts = FIELD_RE.split(template)  # literal text at even indices, slots at odd ones
    if rng.random() < 0.35:
        parts = [p if i % 2 else p.lower() for i, p in enumerate(parts)]
    if rng.random() < 0.25:
        i = 2 * rng.randrange((len(parts) + 1) // 2)
        parts[i] = typo(rng, parts[i])
    out = "".join(parts)
    if rng.random() < 0.25:
        out = out.rstrip(".?!")
    if rng.random() < 0.3:
        out = rng.choice(PREFIXES) + out
    if rng.random() < 0.3:
        out += rng.choice(SUFFIXES)
    return out


@dataclass(frozen=True)
class Phrasings:
    """A task's request templates (``str.format`` fields name the values to fill in)."""

    canonical: str
    train: tuple[str, ...]
    test: tuple[str, ...]

    def __post_init__(self) -> None:
        if set(self.train) & set(self.test) or self.canonical in self.test:
            raise ValueError("a held-out template must never be used in training")

    def choose(self, rng: random.Random, split: str, phrasing: str) -> str:
        """The template as written: canonical, or one of the split's own."""
        if split == "test":
            return self.canonical if phrasing == "templated" else rng.choice(self.test)
        return self.canonical if rng.random() < CANONICAL_FRAC else rng.choice(self.train)

    def template(self, rng: random.Random, split: str, phrasing: str) -> str:
        """The template to fill: ``choose``'s, roughened unless it is the canonical one."""
        t = self.choose(rng, split, phrasing)
        return t if t == self.canonical else roughen(rng, t)


def canonical_wording(split: str, phrasing: str) -> bool:
    """True where an item keeps the canonical notation too (grid, edge and operator formats)."""
    return split == "test" and phrasing == "templated"
