"""``fim``: fill in the middle of an arithmetic progression, in the raw infilling format
``<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>`` (the format the server's
``/v1/fim/completions`` sends to block-causal models); the reply is the middle, then end of text.

The middle is unique (the gap fixes how many terms are missing), so the verifier compares exactly.
Split rule: (start, step) pairs hashed into 10% are test-only. Strata: how many terms are missing.
"""

from __future__ import annotations

import random

from .base import Item, Task, in_split


class Fim(Task):
    name = "fim"
    strata = ("gap1", "gap2", "gap3")
    max_answer_tokens = 24

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        """A raw prompt: no wording to vary."""
        while True:
            start, step = rng.randint(0, 60), rng.randint(1, 12)
            if in_split(("fim", start, step), split):
                break
        n, gap = rng.randint(6, 9), rng.randint(1, 3)
        terms = [str(start + i * step) for i in range(n)]
        i = rng.randint(1, n - gap - 1)
        pre, mid, suf = terms[:i], terms[i : i + gap], terms[i + gap :]
        raw = f"<|fim_prefix|>{', '.join(pre)}, <|fim_suffix|>, {', '.join(suf)}<|fim_middle|>"
        return Item(
            self.name,
            None,
            answer=", ".join(mid),
            raw_prompt=raw,
            stratum=f"gap{gap}",
            data={"middle": ", ".join(mid)},
        )

    def verify(self, item: Item, reply: str) -> bool:
        return reply.strip() == item.data["middle"]
