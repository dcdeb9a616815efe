"""Small code-like files in five languages' syntax, for the edit tasks (apply_edit.py, next_edit.py).

A file is generated as an abstract program (constants, records and functions whose bodies are a few
statements over integer variables) and rendered in Python, JavaScript, TypeScript, Go or Rust syntax
with a ``Layout`` (indentation, blank lines between blocks, identifier words swapped for a held-out
slice of the lexicon). Edits act on the abstract program (rename a variable in one function, insert
or delete statements, change literals), so the original and the edited file render alike everywhere
else. The programs are not meant to run, only to look and indent like real code; names are words
joined per the language's convention (``total_price``, ``totalPrice``, ``MAX_SIZE``, ``Order``).
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

Name = tuple[str, ...]  # an identifier as words: ("total", "price")
Expr = tuple[
    Any, ...
]  # ("n", 3) | ("s", "ready") | ("v", name) | ("b", op, e, e) | ("c", name, [e])
Stmt = tuple[Any, ...]  # see render_stmt

VERBS = ["get", "compute", "count", "scale", "merge", "load", "check", "build", "apply", "update"]
VERBS += ["find", "score", "clamp", "format", "resolve", "sum", "pick", "adjust"]
# variable/noun words: the training slice and a held-out slice (``held-out`` layouts only)
WORDS = ["total", "price", "score", "limit", "rate", "count", "size", "offset", "weight", "delta"]
WORDS += [
    "index",
    "value",
    "budget",
    "level",
    "width",
    "height",
    "speed",
    "margin",
    "bonus",
    "base",
]
WORDS += ["factor", "step", "extra", "cost", "amount", "depth", "length", "result", "tax", "fee"]
HELD_WORDS = ["quota", "tally", "ratio", "span", "pivot", "stride", "ledger", "surge", "spread"]
HELD_WORDS += ["gauge", "notch", "tier", "pulse", "churn", "drift", "quorum", "flux", "crest"]
LISTS = ["items", "values", "scores", "prices", "sizes", "weights", "costs", "points"]
HELD_LISTS = ["tallies", "readings", "samples", "entries"]
TYPES = ["order", "user", "item", "config", "point", "account", "cart", "report", "task", "event"]
# made-up identifier words (``made_up_words``): consonant-vowel syllables, none a lexicon word or a
# keyword or builtin of the five languages
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
NOT_MADE_UP = {"defer", "goto", "super", "delete", "move", "make", "rune", "none", "data"}
MESSAGES = ["ready", "done", "start", "loaded", "saved", "retry", "skip", "error", "ok", "empty"]
MESSAGES += ["invalid", "missing", "updated", "timeout", "failed", "stale"]
OPS = ["+", "-", "*"]
CMPS = [">", "<", ">=", "<="]


@dataclass(frozen=True)
class Lang:
    name: str
    ext: str
    comment: str  # line comment leader
    indents: tuple[str, ...]  # training indentations (the first is canonical)
    held_indents: tuple[str, ...]  # indentations only ``held-out`` layouts use
    cpt: float  # characters per token of the shipped tokenizer, a low percentile (for budgets)


LANGS: dict[str, Lang] = {
    "python": Lang("python", "py", "#", ("    ",), ("  ",), 1.2),
    "javascript": Lang("javascript", "js", "//", ("  ", "    "), ("\t",), 1.27),
    "typescript": Lang("typescript", "ts", "//", ("  ", "    "), ("   ",), 1.38),
    "go": Lang("go", "go", "//", ("\t",), ("    ",), 1.32),
    "rust": Lang("rust", "rs", "//", ("    ",), ("  ",), 1.2),
}


@dataclass(frozen=True)
class Layout:
    """How a program is written out: not what it says."""

    indent: str
    gap: int = 1  # blank lines between top-level blocks
    words: tuple[tuple[str, str], ...] = ()  # identifier word -> replacement (held-out slice)


@dataclass
class Const:
    name: Name
    value: Expr  # ("n", int) or ("s", str)


@dataclass
class Record:
    name: Name
    fields: list[Name]


@dataclass
class Func:
    name: Name
    params: list[Name]
    lists: set[Name]  # which params are lists
    body: list[Stmt]


Block = Const | Record | Func


@dataclass
class Program:
    lang: str
    package: str
    blocks: list[Block] = field(default_factory=list)

    def copy(self) -> Program:
        return copy.deepcopy(self)

    def funcs(self) -> list[Func]:
        return [b for b in self.blocks if isinstance(b, Func)]

    def words(self) -> set[str]:
        """Every identifier word of the program (for held-out lexicon substitution)."""
        out: set[str] = set()
        for b in self.blocks:
            out.update(b.name)
            if isinstance(b, Record):
                for f in b.fields:
                    out.update(f)
            elif isinstance(b, Func):
                for p in b.params:
                    out.update(p)
                for s in b.body:
                    for part in s[1:]:
                        if is_expr(part):
                            walk_expr(part, out)
                        elif isinstance(part, tuple):
                            out.update(part)
        return out


def is_expr(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) >= 2 and x[0] in ("n", "s", "v", "b", "c")


def walk_expr(e: Expr, out: set[str]) -> None:
    if e[0] == "v":
        out.update(e[1])
    elif e[0] == "b":
        walk_expr(e[2], out)
        walk_expr(e[3], out)
    elif e[0] == "c":
        out.update(e[1])
        for a in e[2]:
            walk_expr(a, out)


# ---------------------------------------------------------------------------------------- render


class Writer:
    """Renders a program in one language and layout."""

    def __init__(self, lang: str, layout: Layout) -> None:
        self.lang = LANGS[lang]
        self.layout = layout
        self.sub = dict(layout.words)

    def ident(self, name: Name, kind: str) -> str:
        ws = [self.sub.get(w, w) for w in name]
        lang = self.lang.name
        if kind == "const":
            if lang == "go":
                return ws[0] + "".join(w.capitalize() for w in ws[1:])
            return "_".join(w.upper() for w in ws)
        if kind == "type":
            return "".join(w.capitalize() for w in ws)
        if lang in ("python", "rust"):
            return "_".join(ws)
        if kind == "field" and lang == "go":
            return "".join(w.capitalize() for w in ws)
        return ws[0] + "".join(w.capitalize() for w in ws[1:])

    def expr(self, e: Expr, consts: set[Name]) -> str:
        tag = e[0]
        if tag == "n":
            return str(e[1])
        if tag == "s":
            return f'"{e[1]}"'
        if tag == "v":
            return self.ident(e[1], "const" if e[1] in consts else "var")
        if tag == "b":
            return f"{self.expr(e[2], consts)} {e[1]} {self.expr(e[3], consts)}"
        args = ", ".join(self.expr(a, consts) for a in e[2])
        return f"{self.ident(e[1], 'func')}({args})"

    def semi(self, s: str) -> str:
        return s if self.lang.name in ("python", "go") else s + ";"

    def block_lines(self, lines: list[str], depth: int) -> list[str]:
        return [self.layout.indent * depth + x for x in lines]

    def stmt(self, s: Stmt, d: int, consts: set[Name]) -> list[str]:
        ind, ind1 = self.layout.indent * d, self.layout.indent * (d + 1)
        lang = self.lang.name
        kind = s[0]
        if kind == "let":
            v, e = self.ident(s[1], "var"), self.expr(s[2], consts)
            line = {
                "python": f"{v} = {e}",
                "go": f"{v} := {e}",
                "rust": f"let mut {v} = {e}",
            }.get(lang, f"let {v} = {e}")
            return [ind + self.semi(line)]
        if kind == "add":
            return [ind + self.semi(f"{self.ident(s[1], 'var')} {s[2]}= {self.expr(s[3], consts)}")]
        if kind == "ret":
            return [ind + self.semi(f"return {self.expr(s[1], consts)}")]
        if kind == "log":
            msg, e = s[1], self.expr(s[2], consts)
            line = {
                "python": f'print("{msg}", {e})',
                "go": f'fmt.Println("{msg}", {e})',
                "rust": f'println!("{msg} {{}}", {e})',
            }.get(lang, f'console.log("{msg}", {e})')
            return [ind + self.semi(line)]
        if kind == "if":  # ("if", var, cmp, expr, ret expr)
            cond = f"{self.ident(s[1], 'var')} {s[2]} {self.expr(s[3], consts)}"
            ret = ind1 + self.semi(f"return {self.expr(s[4], consts)}")
            if lang == "python":
                return [f"{ind}if {cond}:", ret]
            if lang in ("go", "rust"):
                return [f"{ind}if {cond} {{", ret, ind + "}"]
            return [f"{ind}if ({cond}) {{", ret, ind + "}"]
        if kind == "for":  # ("for", item, list, acc)
            it, xs, acc = (self.ident(x, "var") for x in s[1:4])
            body = ind1 + self.semi(f"{acc} += {it}")
            head = {
                "python": f"for {it} in {xs}:",
                "go": f"for _, {it} := range {xs} {{",
                "rust": f"for {it} in {xs} {{",
            }.get(lang, f"for (const {it} of {xs}) {{")
            return [ind + head, body] + ([] if lang == "python" else [ind + "}"])
        raise ValueError(f"unknown statement {kind!r}")

    def param(self, p: Name, is_list: bool) -> str:
        v = self.ident(p, "var")
        lang = self.lang.name
        if lang == "typescript":
            return f"{v}: number[]" if is_list else f"{v}: number"
        if lang == "go":
            return f"{v} []int" if is_list else f"{v} int"
        if lang == "rust":
            return f"{v}: &[i32]" if is_list else f"{v}: i32"
        return v

    def func(self, f: Func, consts: set[Name]) -> list[str]:
        name = self.ident(f.name, "func")
        ps = ", ".join(self.param(p, p in f.lists) for p in f.params)
        head = {
            "python": f"def {name}({ps}):",
            "javascript": f"function {name}({ps}) {{",
            "typescript": f"function {name}({ps}): number {{",
            "go": f"func {name}({ps}) int {{",
            "rust": f"fn {name}({ps}) -> i32 {{",
        }[self.lang.name]
        body = [x for s in f.body for x in self.stmt(s, 1, consts)]
        return [head, *body] + ([] if self.lang.name == "python" else ["}"])

    def const(self, c: Const) -> list[str]:
        name, v = self.ident(c.name, "const"), self.expr(c.value, set())
        is_str = c.value[0] == "s"
        return [
            {
                "python": f"{name} = {v}",
                "javascript": f"const {name} = {v};",
                "typescript": f"const {name}: {'string' if is_str else 'number'} = {v};",
                "go": f"const {name} = {v}",
                "rust": f"const {name}: {'&str' if is_str else 'i32'} = {v};",
            }[self.lang.name]
        ]

    def record(self, r: Record) -> list[str]:
        name, i = self.ident(r.name, "type"), self.layout.indent
        fs = [self.ident(f, "field") for f in r.fields]
        lang = self.lang.name
        if lang == "python":
            return [f"class {name}:", f"{i}def __init__(self, {', '.join(fs)}):"] + [
                f"{i}{i}self.{f} = {f}" for f in fs
            ]
        if lang == "go":
            return [f"type {name} struct {{"] + [f"{i}{f} int" for f in fs] + ["}"]
        if lang == "rust":
            return [f"struct {name} {{"] + [f"{i}{f}: i32," for f in fs] + ["}"]
        ps = ", ".join(f"{f}: number" if lang == "typescript" else f for f in fs)
        return (
            [f"class {name} {{", f"{i}constructor({ps}) {{"]
            + [f"{i}{i}this.{f} = {f};" for f in fs]
            + [f"{i}}}", "}"]
        )

    def blocks(self, prog: Program) -> list[list[str]]:
        consts = {b.name for b in prog.blocks if isinstance(b, Const)}
        out = [[f"package {prog.package}"]] if self.lang.name == "go" else []
        for b in prog.blocks:
            if isinstance(b, Const):
                out.append(self.const(b))
            elif isinstance(b, Record):
                out.append(self.record(b))
            else:
                out.append(self.func(b, consts))
        # consecutive constants form one block
        merged: list[list[str]] = []
        prev = ""
        kinds = (["pkg"] if self.lang.name == "go" else []) + [
            type(b).__name__ for b in prog.blocks
        ]
        for k, lines in zip(kinds, out):
            if merged and k == "Const" and prev == "Const":
                merged[-1] += lines
            else:
                merged.append(list(lines))
            prev = k
        return merged


def made_up_words(rng: random.Random, words: set[str]) -> tuple[tuple[str, str], ...]:
    """Each of ``words`` (sorted) mapped to a distinct made-up word of 2-3 syllables, maybe closed by
    a consonant (``dofa``, ``kelumin``): identifiers no lexicon predicts, so only copying them does."""
    taken = set(NOT_MADE_UP) | set(VERBS + WORDS + HELD_WORDS + LISTS + HELD_LISTS + TYPES)
    out: list[tuple[str, str]] = []
    for word in sorted(words):
        made = ""
        while not made or made in taken:
            syllables = (
                rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(2, 3))
            )
            made = "".join(syllables) + (rng.choice(CONSONANTS) if rng.random() < 0.3 else "")
        taken.add(made)
        out.append((word, made))
    return tuple(out)


MADE_UP_COST = 1.1  # made-up names run up to ~7% more tokens than the lexicon's estimate


def est_tokens(lang: str, text: str, made_up: bool = False) -> float:
    """A cautious estimate of the shipped tokenizer's count (generators cannot load it); ``made_up``:
    the text's names are made-up words (made_up_words), which cost more tokens."""
    return (MADE_UP_COST if made_up else 1.0) * (len(text) / LANGS[lang].cpt)


def render(prog: Program, layout: Layout) -> list[str]:
    """The program's lines in its language and ``layout``."""
    out: list[str] = []
    for i, lines in enumerate(Writer(prog.lang, layout).blocks(prog)):
        if i:
            out += [""] * layout.gap
        out += lines
    return out


def ident(prog: Program, layout: Layout, name: Name, kind: str = "var") -> str:
    return Writer(prog.lang, layout).ident(name, kind)


# -------------------------------------------------------------------------------------- generate


class Namer:
    """Fresh names from the lexicon, never the same one twice in a program."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[Name] = set()
        self.words: set[str] = set()

    def take(self, pool: list[Name]) -> Name:
        free = [n for n in pool if n not in self.used and not set(n) & self.words]
        n = self.rng.choice(free)
        self.used.add(n)
        self.words.update(n)
        return n

    def var(self) -> Name:
        return self.take([(w,) for w in WORDS])

    def list_(self) -> Name:
        return self.take([(w,) for w in LISTS])

    def func(self) -> Name:
        return self.take([(v, w) for v in VERBS for w in WORDS])

    def const(self) -> Name:
        pre = ["max", "min", "default"]
        return self.take([(p, w) for p in pre for w in WORDS])

    def type_(self) -> Name:
        return self.take([(w,) for w in TYPES])


def number(rng: random.Random, pool: list[int] | None = None) -> int:
    return rng.choice(pool) if pool else rng.choice([2, 3, 5, 10, 12, 20, 25, 50, 64, 100, 255])


def gen_func(
    rng: random.Random,
    nm: Namer,
    consts: list[Name],
    lits: list[int] | None = None,
    calls: Func | None = None,
    most: int = 3,
) -> Func:
    """A function of 1-3 parameters: an accumulator, then 1-4 of loop / guard / update / log, then
    its return. ``calls``: a helper this function calls (its ``let`` draws a call to it)."""
    name = nm.func()
    n_params = rng.randint(1, 3)
    params = [nm.var() for _ in range(n_params)]
    lists: set[Name] = set()
    if rng.random() < 0.4:
        params[-1] = nm.list_()
        lists.add(params[-1])
    scalars = [p for p in params if p not in lists] or [nm.var()]
    if scalars[0] not in params:
        params.insert(0, scalars[0])
    acc = nm.var()

    def operand() -> Expr:
        r = rng.random()
        if consts and r < 0.25:
            return ("v", rng.choice(consts))
        if r < 0.6:
            return ("v", rng.choice(scalars))
        return ("n", number(rng, lits))

    second = operand()
    if second == ("v", scalars[0]):
        second = ("n", number(rng, lits))
    init: Expr = ("b", rng.choice(OPS), ("v", scalars[0]), second)
    if calls is not None:
        init = ("c", calls.name, [("v", rng.choice(scalars)) for _ in calls.params])
    body: list[Stmt] = [("let", acc, init)]
    extras = ["if", "add", "log", "for"] if lists else ["if", "add", "log", "add2"]
    for kind in rng.sample(extras, rng.randint(min(1, most), most)):
        body.append(extra_stmt(rng, kind, acc, scalars, lists, consts, lits, nm))
    body.append(("ret", ("v", acc)))
    return Func(name, params, lists, body)


def extra_stmt(
    rng: random.Random,
    kind: str,
    acc: Name,
    scalars: list[Name],
    lists: set[Name],
    consts: list[Name],
    lits: list[int] | None,
    nm: Namer | None = None,
) -> Stmt:
    """One statement that may go between a function's accumulator and its return."""
    if kind == "if":
        ret: Expr = ("n", number(rng, lits)) if rng.random() < 0.5 else ("v", acc)
        use_const = consts and rng.random() < 0.3
        bound: Expr = ("v", rng.choice(consts)) if use_const else ("n", number(rng, lits))
        return ("if", acc, rng.choice(CMPS), bound, ret)
    if kind == "log":
        return ("log", rng.choice(MESSAGES), ("v", acc))
    if kind == "for" and lists and nm is not None:
        item = nm.var()
        return ("for", item, next(iter(lists)), acc)
    other: Expr = ("v", rng.choice(scalars)) if rng.random() < 0.5 else ("n", number(rng, lits))
    return ("add", acc, rng.choice(OPS[:2]), other)


def gen_program(
    rng: random.Random,
    lang: str,
    n_funcs: int | None = None,
    lits: list[int] | None = None,
    helper: bool = False,
    small: bool = False,
    most: int = 3,
) -> Program:
    """A file: 0-2 constants, maybe a record, 1-2 functions (``helper``: a second function calls
    the first; ``small``: at most one constant and no record; ``most``: statements a body may add
    between its first line and its return)."""
    nm = Namer(rng)
    prog = Program(lang, rng.choice(["main", "util", "calc", "store", "core"]))
    consts: list[Name] = []
    for _ in range(rng.choice([0, 1] if small else [0, 1, 1, 2])):
        c = nm.const()
        consts.append(c)
        value: Expr = (
            ("n", number(rng, lits)) if rng.random() < 0.8 else ("s", rng.choice(MESSAGES))
        )
        prog.blocks.append(Const(c, value))
    num_consts = [b.name for b in prog.blocks if isinstance(b, Const) and b.value[0] == "n"]
    if not small and rng.random() < 0.25:
        prog.blocks.append(Record(nm.type_(), [nm.var() for _ in range(rng.randint(2, 3))]))
    n = n_funcs or rng.choice([1, 2, 2])
    first = gen_func(rng, nm, num_consts, lits, most=most)
    prog.blocks.append(first)
    for _ in range(n - 1):
        callee = first if helper else None
        prog.blocks.append(gen_func(rng, nm, num_consts, lits, calls=callee, most=most))
    return prog
