"""``sudoku4``: complete a 4x4 sudoku (2x2 boxes).

All 288 valid 4x4 grids are enumerated once; a puzzle blanks 4..12 cells. Because there are so few
grids, the split is by *blank pattern*: the hash of the 16-bit pattern decides train or test, so a
test puzzle's pattern of givens never occurs in training. The verifier checks the reply is a valid
grid that keeps every given (puzzles with many blanks can have several solutions; all count).
Canonical format: rows of digits separated by ``/``, blanks as ``.``; requests also come in other
notations (newlines, ``0`` or ``_`` blanks, spaced digits) and wordings (phrasing.py); the answer is
always the canonical format. Strata by blank count.
"""

from __future__ import annotations

import itertools
import random
from functools import lru_cache

from .base import Item, Task, in_split
from .phrasing import Phrasings, canonical_wording


@lru_cache(maxsize=1)
def all_grids() -> list[tuple[int, ...]]:
    """Every valid 4x4 sudoku grid as a flat tuple of 16 digits (there are 288)."""
    rows = list(itertools.permutations((1, 2, 3, 4)))
    out = []
    for r in itertools.product(rows, repeat=4):
        g = tuple(v for row in r for v in row)
        if is_valid(g):
            out.append(g)
    return out


def units() -> list[list[int]]:
    rows = [[r * 4 + c for c in range(4)] for r in range(4)]
    cols = [[r * 4 + c for r in range(4)] for c in range(4)]
    boxes = [
        [(br + dr) * 4 + bc + dc for dr in (0, 1) for dc in (0, 1)]
        for br in (0, 2)
        for bc in (0, 2)
    ]
    return rows + cols + boxes


UNITS = units()


def is_valid(g: tuple[int, ...] | list[int]) -> bool:
    return len(g) == 16 and all(sorted(g[i] for i in u) == [1, 2, 3, 4] for u in UNITS)


def render(g: list[int] | tuple[int, ...]) -> str:
    return "/".join("".join(str(v) if v else "." for v in g[r * 4 : (r + 1) * 4]) for r in range(4))


def parse(text: str) -> list[int] | None:
    rows = text.strip().split("/")
    if len(rows) != 4 or any(len(r) != 4 for r in rows):
        return None
    try:
        return [int(ch) for r in rows for ch in r]
    except ValueError:
        return None


# grid notations: (row separator, blank, digit separator); the first is the canonical one
GRID_STYLES = (
    ("/", ".", ""),
    (" / ", ".", ""),
    ("\n", ".", ""),
    ("/", "0", ""),
    ("\n", "_", " "),
    (" | ", ".", " "),
    ("\n", "0", " "),
    ("; ", "_", ""),
)
SUDOKU_PHRASES = Phrasings(
    canonical="Solve the sudoku: {grid}",
    train=(
        "Solve this 4x4 sudoku: {grid}",
        "Complete the sudoku {grid}",
        "Fill in the blanks of this sudoku:\n{grid}",
        "sudoku: {grid}",
        "Can you solve {grid}?",
        "Here is a 4x4 sudoku, solve it: {grid}",
        "Please finish this puzzle: {grid}",
        "{grid}\nSolve this sudoku.",
        "Each row, column and 2x2 box needs 1-4. Solve: {grid}",
    ),
    test=(
        "Help me with this sudoku: {grid}",
        "What is the solution of the sudoku {grid}?",
        "Solve:\n{grid}",
        "I am stuck on this sudoku {grid}, can you finish it?",
    ),
)


def render_as(g: list[int] | tuple[int, ...], style: int) -> str:
    """The grid in notation ``GRID_STYLES[style]`` (0 is ``render``'s)."""
    rows_sep, blank, sep = GRID_STYLES[style]
    rows = (g[r * 4 : (r + 1) * 4] for r in range(4))
    return rows_sep.join(sep.join(str(v) if v else blank for v in row) for row in rows)


class Sudoku4(Task):
    name = "sudoku4"
    strata = ("blanks4-6", "blanks7-9", "blanks10-12")
    max_answer_tokens = 32

    def sample(
        self,
        rng: random.Random,
        split: str,
        phrasing: str = "templated",
        wording: random.Random | None = None,
    ) -> Item:
        grids = all_grids()
        while True:
            k = rng.randint(4, 12)
            blanks = frozenset(rng.sample(range(16), k))
            pattern = sum(1 << i for i in blanks)
            if in_split(("sudoku4", pattern), split):
                break
        g = rng.choice(grids)
        puzzle = [0 if i in blanks else v for i, v in enumerate(g)]
        lo = (k - 4) // 3 * 3 + 4
        w = wording or rng
        style = 0 if canonical_wording(split, phrasing) else w.randrange(len(GRID_STYLES))
        request = SUDOKU_PHRASES.template(w, split, phrasing).format(grid=render_as(puzzle, style))
        return Item(
            self.name,
            [{"role": "user", "content": request}],
            answer=render(g),
            stratum=f"blanks{lo}-{lo + 2}",
            data={"puzzle": puzzle},
        )

    def verify(self, item: Item, reply: str) -> bool:
        g = parse(reply)
        if g is None or not is_valid(g):
            return False
        return all(p == 0 or p == v for p, v in zip(item.data["puzzle"], g))
