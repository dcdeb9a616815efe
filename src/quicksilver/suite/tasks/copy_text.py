"""``copy_text``: the apply route with nothing to change — copy a file of random text exactly.

A drill for copying, the skill under apply_edit and next_edit: the prompt is the apply route's
(``APPLY_SYSTEM``, ``<|original_code|>`` and an ``<|update_snippet|>`` that is only an elision
marker), and the original is random lines — indentation, identifiers of random letters, digits
and punctuation — so no knowledge of code predicts the next token and only pointing back into the
original does. The answer is the original, unchanged. On the shipped tokenizer (letters are single
tokens) a file is at most ``max_chars`` characters, about as many tokens: ``copy_text`` up to
260, ``copy_short`` up to 60 (short copies first: the pointer forms on short distances).

``copy_code`` is the same drill over apply_edit's generated code files (two functions, a
language's keywords and names repeated): there the last token or two recur across the file
(``return``, ``print("``), so copying needs the pointer to track its place rather than match the
last token alone — the errors a model that copies random text still makes on code.
``copy_code_made_up`` copies such files with every identifier a made-up word.

Split rule: the file's first identifier (copy_code: first function name) hashed into 10% is
test-only. Verifier: apply_edit's (exact match after its normalisation).
"""

from __future__ import annotations

import random
import string

from ..edit_format import APPLY_SYSTEM, apply_message
from .apply_edit import MAX_ANSWER, normalize, split_key
from .base import Item, Task, in_split
from .codegen import LANGS, Layout, est_tokens, gen_program, made_up_words, render

PUNCT = "=+-*/(),.:;{}[]<>"
COMMENTS = ("#", "//", "--")
INDENTS = ("", "  ", "    ", "        ", "\t")


def identifier(rng: random.Random) -> str:
    first = rng.choice(string.ascii_letters + "_")
    rest = "".join(rng.choices(string.ascii_letters + string.digits + "_", k=rng.randint(1, 8)))
    return first + rest


def piece(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.6:
        return identifier(rng)
    if r < 0.8:
        return str(rng.randint(0, 9999))
    return "".join(rng.choices(PUNCT, k=rng.randint(1, 2)))


def random_file(rng: random.Random, max_chars: int) -> list[str]:
    """Up to 14 lines of random pieces under random indentation, at most ``max_chars`` in all."""
    lines: list[str] = []
    for _ in range(rng.randint(4, 14)):
        sep = rng.choice((" ", "", ", "))
        line = rng.choice(INDENTS) + sep.join(piece(rng) for _ in range(rng.randint(1, 6)))
        if sum(len(x) + 1 for x in lines) + len(line) > max_chars:
            break
        lines.append(line)
    return lines


def copy_item(name: str, original: str, marker: str) -> Item:
    """The apply route asking for ``original`` unchanged: the update snippet is only ``marker``."""
    messages = [
        {"role": "system", "content": APPLY_SYSTEM},
        {"role": "user", "content": apply_message(original, f"{marker} ... existing code ...")},
    ]
    return Item(name, messages, answer=original, data={"expected": original})


class CopyText(Task):
    def __init__(self, name: str, max_chars: int) -> None:
        self.name, self.max_chars = name, max_chars
        self.max_answer_tokens = max_chars + 32

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        """One random file; the marker's comment leader is drawn from ``wording``."""
        w = wording or rng
        while True:
            lines = random_file(rng, self.max_chars)
            if len(lines) >= 2 and lines[0].strip() and in_split((self.name, lines[0]), split):
                break
        return copy_item(self.name, "\n".join(lines).lstrip(), w.choice(COMMENTS))

    def verify(self, item: Item, reply: str) -> bool:
        return normalize(reply) == normalize(item.data["expected"])


class CopyCode(CopyText):
    def __init__(self, name: str = "copy_code", made_up: bool = False) -> None:
        self.name, self.max_answer_tokens, self.made_up = name, MAX_ANSWER + 17, made_up

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        """A generated file of two functions in one of apply_edit's languages and indentations."""
        while True:
            lang = rng.choice(sorted(LANGS))
            prog = gen_program(rng, lang, n_funcs=2)
            if not in_split((self.name, split_key(prog)), split):
                continue
            words = made_up_words(rng, prog.words()) if self.made_up else ()
            lines = render(prog, Layout(rng.choice(LANGS[lang].indents), words=words))
            original = "\n".join(lines)
            if 8 <= len(lines) <= 24 and est_tokens(lang, original, self.made_up) <= MAX_ANSWER:
                return copy_item(self.name, original, LANGS[lang].comment)
