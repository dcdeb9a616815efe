"""Edits on generated programs (codegen.py) and the update snippets that describe them.

An edit renames a variable everywhere in one function, inserts or deletes statements, or changes a
literal; ``multi`` does two or three of them in different blocks. ``update_snippet`` writes the
edited file's changed lines with enough unchanged context around each change to place it (context
lines that occur once in the original), and an elision marker in the language's comment style
(``# ... existing code ...``) for every run of lines it leaves out; a deletion shows the lines around
the gap with no marker between them. Snippets whose placement would be ambiguous are refused
(``None``), so the merged file is the only one an update snippet describes.
"""

from __future__ import annotations

import random
from difflib import SequenceMatcher
from typing import Any

from .codegen import (
    CMPS,
    MESSAGES,
    WORDS,
    Const,
    Func,
    Name,
    Namer,
    Program,
    Stmt,
    extra_stmt,
    is_expr,
    number,
)

KINDS = ("rename", "insert", "delete", "literal", "multi")


def replace_name(x: Any, old: Name, new: Name) -> Any:
    """``x`` with every occurrence of the name ``old`` replaced by ``new`` (expressions, names)."""
    if x == old:
        return new
    if isinstance(x, tuple):
        return tuple(replace_name(y, old, new) for y in x)
    if isinstance(x, list):
        return [replace_name(y, old, new) for y in x]
    if isinstance(x, set):
        return {replace_name(y, old, new) for y in x}
    return x


def local_names(f: Func) -> list[Name]:
    """Parameters and variables a function binds."""
    out = list(f.params)
    for s in f.body:
        if s[0] == "let" or s[0] == "for":
            out.append(s[1])
    return out


def fresh_var(rng: random.Random, prog: Program) -> Name:
    used = prog.words()
    return (rng.choice([w for w in WORDS if w not in used]),)


def rename(rng: random.Random, prog: Program, f: Func) -> bool:
    names = local_names(f)
    used = [n for n in names if str(f.body).count(repr(n)) >= 2]
    old = rng.choice(used or names)
    new = fresh_var(rng, prog)
    f.params = replace_name(f.params, old, new)
    f.lists = replace_name(f.lists, old, new)
    f.body = replace_name(f.body, old, new)
    return True


def insert(rng: random.Random, prog: Program, f: Func) -> bool:
    acc = f.body[0][1]
    scalars = [p for p in f.params if p not in f.lists]
    consts = [b.name for b in prog.blocks if isinstance(b, Const) and b.value[0] == "n"]
    for _ in range(rng.choice([1, 1, 2])):
        s = extra_stmt(rng, rng.choice(["if", "add", "log"]), acc, scalars, set(), consts, None)
        f.body.insert(rng.randint(1, len(f.body) - 1), s)
    return True


def delete(rng: random.Random, prog: Program, f: Func) -> bool:
    middle = list(range(1, len(f.body) - 1))
    if not middle:
        return False
    for i in sorted(rng.sample(middle, min(len(middle), rng.choice([1, 1, 2]))), reverse=True):
        del f.body[i]
    return True


def _literal_sites(s: Stmt) -> list[tuple[int, ...]]:
    """Paths to the number and message literals of a statement."""
    out: list[tuple[int, ...]] = []
    if s[0] == "log":
        out.append((1,))

    def walk(e: Any, path: tuple[int, ...]) -> None:
        if not is_expr(e):
            return
        if e[0] in ("n", "s"):
            out.append(path)
        elif e[0] == "b":
            walk(e[2], (*path, 2))
            walk(e[3], (*path, 3))
        elif e[0] == "c":
            for j, a in enumerate(e[2]):
                walk(a, (*path, 2, j))

    for i, part in enumerate(s):
        walk(part, (i,))
    return out


def _get(x: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        x = x[i]
    return x


def _set(x: Any, path: tuple[int, ...], v: Any) -> Any:
    if not path:
        return v
    items = list(x)
    items[path[0]] = _set(items[path[0]], path[1:], v)
    return type(x)(items) if not isinstance(x, list) else items


def _other(rng: random.Random, v: Any) -> Any:
    if isinstance(v, tuple) and v[0] == "n":
        return ("n", rng.choice([n for n in (1, 4, 8, 15, 30, 40, 75, 99, 128, 500) if n != v[1]]))
    if isinstance(v, tuple) and v[0] == "s":
        return ("s", rng.choice([m for m in MESSAGES if m != v[1]]))
    return rng.choice([m for m in MESSAGES if m != v])  # a log message


def literal(rng: random.Random, prog: Program, block: Func | Const) -> bool:
    if isinstance(block, Const):
        block.value = _other(rng, block.value)
        return True
    sites = [(i, p) for i, s in enumerate(block.body) for p in _literal_sites(s)]
    if not sites:
        return False
    i, path = rng.choice(sites)
    block.body[i] = _set(block.body[i], path, _other(rng, _get(block.body[i], path)))
    return True


OPS_ON_FUNCS = {"rename": rename, "insert": insert, "delete": delete, "literal": literal}


def apply_edit(rng: random.Random, prog: Program, kind: str) -> Program | None:
    """The edited copy of ``prog`` (None when this program offers no such edit)."""
    new = prog.copy()
    funcs = new.funcs()
    if kind != "multi":
        return new if OPS_ON_FUNCS[kind](rng, new, rng.choice(funcs)) else None
    targets: list[Func | Const] = [b for b in new.blocks if isinstance(b, Func | Const)]
    if len(targets) < 2:
        return None
    for b in rng.sample(targets, min(len(targets), rng.choice([2, 2, 3]))):
        if isinstance(b, Const):
            literal(rng, new, b)
        elif not OPS_ON_FUNCS[rng.choice(list(OPS_ON_FUNCS))](rng, new, b):
            return None
    return new


def occurrences(lines: list[str], seq: list[str]) -> int:
    k = len(seq)
    return sum(lines[i : i + k] == seq for i in range(len(lines) - k + 1))


def _grow(lines: list[str], i: int, step: int, need: int) -> int:
    """Where a context run from ``i`` ends (``step`` -1: backwards, as a start index; +1: forwards,
    as an end index) once it covers ``need`` anchor lines (lines with a word or number: a lone
    brace anchors nothing) or reaches the file's edge."""
    got = 0
    if step < 0:
        while i > 0 and got < need:
            i -= 1
            got += anchor(lines[i])
    else:
        while i < len(lines) and got < need:
            got += anchor(lines[i])
            i += 1
    return i


def anchor(line: str) -> bool:
    return any(c.isalnum() for c in line)


def hunks(a: list[str], b: list[str], context: int) -> list[list[int]] | None:
    """Hunks [s, i1, i2, e, j1, j2]: a[s:e] shown as b[s':e'] where the change is a[i1:i2] ->
    b[j1:j2] and a[s:i1], a[i2:e] are context; None if a context run cannot be made unique."""
    ops = [o for o in SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if o[0] != "equal"]
    groups: list[list[int]] = []
    for _, i1, i2, j1, j2 in ops:
        gap = a[groups[-1][1] : i1] if groups else None
        if gap is not None and (len(gap) <= 2 or not any(x.strip() for x in gap)):
            groups[-1][1], groups[-1][3] = i2, j2
        else:
            groups.append([i1, i2, j1, j2])
    out = []
    for i1, i2, j1, j2 in groups:
        for k in range(context, 4):
            s, e = _grow(a, i1, -1, k), _grow(a, i2, 1, k)
            before, after = a[s:i1], a[i2:e]
            ok_b = s == 0 or (any(x.strip() for x in before) and occurrences(a, before) == 1)
            ok_a = e == len(a) or (any(x.strip() for x in after) and occurrences(a, after) == 1)
            if ok_b and ok_a:
                break
        else:
            return None
        out.append([s, i1, i2, e, j1, j2])
    # hunks whose context runs meet are one hunk
    merged: list[list[int]] = []
    for h in out:
        if merged and h[0] <= merged[-1][3] + 1:
            merged[-1][2], merged[-1][3], merged[-1][5] = h[2], h[3], h[5]
        else:
            merged.append(h)
    return merged


def indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def update_snippet(a: list[str], b: list[str], marker: str, context: int = 1) -> str | None:
    """The update snippet turning ``a`` into ``b``: changed lines with context, ``marker`` (a whole
    comment, e.g. ``// ... existing code ...``) where lines are left out."""
    hs = hunks(a, b, context)
    if not hs:
        return None
    out: list[str] = []
    last = 0
    for s, i1, i2, e, j1, j2 in hs:
        if s > last:
            elided = [x for x in a[last:s] if x.strip()]
            if elided:
                out.append(indent_of(elided[0]) + marker)
        out += a[s:i1] + b[j1:j2] + a[i2:e]
        last = e
    if last < len(a) and any(x.strip() for x in a[last:]):
        out.append(indent_of(next(x for x in a[last:] if x.strip())) + marker)
    return "\n".join(out)


__all__ = ["CMPS", "KINDS", "Namer", "apply_edit", "number", "update_snippet"]
