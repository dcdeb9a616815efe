"""``apply_edit``: merge an update snippet into the original file (Mercury Edit's apply-edit).

The prompt is the apply route's: the system prompt ``APPLY_SYSTEM`` and one user message with the
``<|original_code|>`` and ``<|update_snippet|>`` sections (``edit_format.apply_message``); the answer
is the whole merged file, with no reasoning. Files are 8-20 lines of Python, JavaScript, TypeScript,
Go or Rust (codegen.py); the edit renames a variable in one function, inserts or deletes lines,
changes a literal, or touches two or three places (``multi``): the strata. The update snippet shows
the changed lines with unique context and elides the rest with a marker in the language's comment
style (edits.py), so the merged file is determined by the prompt.

Split rule: the file's first function name (as lexicon words) hashed into 10% is test-only. Wording:
training mixes the canonical marker ``... existing code ...`` with train-only variants and the
training indentations; the ``templated`` test split uses the canonical marker and each language's
canonical indentation; ``held-out`` uses markers never trained on and at least one layout never
trained on (an indentation width, two blank lines between blocks, identifiers from a held-out slice
of the lexicon). ``apply_edit_made_up`` is the same task over files whose identifiers are all
made-up words (codegen.made_up_words) in every split: a copy drill on code, since no lexicon
predicts those names and only pointing back into the prompt does. Budgets (the shipped tokenizer,
~1.5 characters a token on code): prompt <= 600 tokens, answer <= 350 (a test measures them).

Verifier: exact match with the reference file after ``strip_wrapper``, trailing whitespace removed
per line and blank lines at either end dropped (evaluation strips the reply, so the first line's
indentation is not compared; a file's first line is never indented).
"""

from __future__ import annotations

import dataclasses
import random

from ..edit_format import APPLY_SYSTEM, apply_message, strip_wrapper
from .base import Item, Task, in_split
from .codegen import (
    HELD_LISTS,
    HELD_WORDS,
    LANGS,
    LISTS,
    WORDS,
    Layout,
    Program,
    est_tokens,
    gen_program,
    made_up_words,
    render,
)
from .edits import KINDS, apply_edit, update_snippet
from .phrasing import Phrasings

# the marker's text after the comment leader
MARKERS = Phrasings(
    "... existing code ...",
    (
        "... existing code",
        "...",
        "... rest of code ...",
        "... unchanged code ...",
        "existing code ...",
        "... keep as is ...",
        "... other code ...",
    ),
    (
        "... rest of the function unchanged ...",
        "... keep existing code ...",
        "(unchanged)",
        "... same as before ...",
        "... code omitted ...",
    ),
)
MAX_ANSWER = 335  # estimated tokens of the merged file
MAX_CODE = 480  # estimated tokens of original + snippet (<= 600 with the system prompt and tags)


def normalize(text: str) -> str:
    """A reply as compared: no wrapper, no trailing spaces, no blank lines at either end."""
    lines = strip_wrapper(text).strip().split("\n")
    return "\n".join(x.rstrip() for x in lines)


def choose_layout(
    rng: random.Random,
    lang: str,
    split: str,
    phrasing: str,
    words: set[str],
    made_up: bool = False,
) -> tuple[Layout, list[str]]:
    """A layout and the names of its held-out features (none outside ``held-out``); ``made_up``
    swaps every identifier word for a made-up one (codegen.made_up_words) in every split."""
    layout, feats = split_layout(rng, lang, split, phrasing, words)
    if not made_up:
        return layout, feats
    swapped = dataclasses.replace(layout, words=made_up_words(rng, words))
    return swapped, [f for f in feats if f != "words"]


def split_layout(
    rng: random.Random, lang: str, split: str, phrasing: str, words: set[str]
) -> tuple[Layout, list[str]]:
    """The split's layout: a training indentation, the canonical one, or held-out features."""
    spec = LANGS[lang]
    if split == "train":
        return Layout(rng.choice(spec.indents)), []
    if phrasing == "templated":
        return Layout(spec.indents[0]), []
    feats: list[str] = []
    while not feats:
        feats = [f for f in ("indent", "gap", "words") if rng.random() < 0.5]
    indent = rng.choice(spec.held_indents) if "indent" in feats else spec.indents[0]
    sub: tuple[tuple[str, str], ...] = ()
    if "words" in feats:
        mine = sorted(w for w in words if w in WORDS)
        held = rng.sample(HELD_WORDS, min(len(mine), len(HELD_WORDS)))
        lists = sorted(w for w in words if w in LISTS)
        sub = tuple(zip(mine, held)) + tuple(zip(lists, rng.sample(HELD_LISTS, len(lists))))
    return Layout(indent, 2 if "gap" in feats else 1, sub), feats


def split_key(prog: Program) -> tuple[str, ...]:
    return prog.funcs()[0].name


class ApplyEdit(Task):
    strata = KINDS
    max_answer_tokens = 352

    def __init__(self, name: str = "apply_edit", made_up: bool = False) -> None:
        self.name, self.made_up = name, made_up

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        w = wording or rng
        lang, kind = rng.choice(sorted(LANGS)), rng.choice(KINDS)  # drawn once: balanced strata
        while True:
            prog = gen_program(rng, lang, n_funcs=2 if kind == "multi" else None)
            if not in_split(("apply_edit", split_key(prog)), split):
                continue
            new = apply_edit(rng, prog, kind)
            if new is None:
                continue
            canon = Layout(LANGS[lang].indents[0])
            a0, b0 = render(prog, canon), render(new, canon)
            if a0 == b0 or not 8 <= len(a0) <= 20 or not 8 <= len(b0) <= 20:
                continue
            if est_tokens(lang, "\n".join(b0)) > MAX_ANSWER:
                continue
            marker_text = MARKERS.choose(w, split, phrasing)
            marker = f"{LANGS[lang].comment} {marker_text}"
            words = prog.words() | new.words()
            layout, feats = choose_layout(w, lang, split, phrasing, words, self.made_up)
            a, b = render(prog, layout), render(new, layout)
            snippet = update_snippet(a, b, marker, context=1)
            original, answer = "\n".join(a), "\n".join(b)
            if snippet is None or est_tokens(lang, "\n".join(a0) + snippet) > MAX_CODE:
                continue
            if self.made_up and (
                est_tokens(lang, answer, True) > MAX_ANSWER
                or est_tokens(lang, original + snippet, True) > MAX_CODE
            ):
                continue
            break
        messages = [
            {"role": "system", "content": APPLY_SYSTEM},
            {"role": "user", "content": apply_message(original, snippet)},
        ]
        return Item(
            self.name,
            messages,
            answer=answer,
            stratum=kind,
            data={
                "expected": answer,
                "lang": lang,
                "key": split_key(prog),
                "marker": marker_text,
                "layout": feats,
            },
        )

    def verify(self, item: Item, reply: str) -> bool:
        return normalize(reply) == normalize(item.data["expected"])
