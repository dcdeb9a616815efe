"""``next_edit``: predict the developer's next edit (Mercury Edit's next-edit).

The prompt is the edit route's: the system prompt ``NEXT_EDIT_SYSTEM`` and one user message
(``edit_format.next_edit_message``) with 0-2 recently viewed snippets from other files, the current
file with an editable region of 3-10 lines holding ``<|cursor|>``, and the history: one or two unified
diffs of the developer's latest edits, newest last. The answer is the rewritten region without the
cursor marker, no reasoning. Files come from codegen.py (Python, JavaScript, TypeScript, Go, Rust).

Strata, by what the history started:
- ``rename``: a variable renamed ``old`` -> ``new`` on its first line(s) of a function; the region
  holds lines of the same function that still say ``old``.
- ``literal``: one occurrence of a repeated number changed (to another number, or to the name of the
  constant that holds it); the region holds further occurrences (never a constant's definition).
- ``param``: a parameter added to a function's definition and one call site updated with the new
  argument (a number); the region holds other calls with the old argument count.

Verifier, exactly: the region must become the region with the started edit applied consistently,
that is every remaining occurrence in it rewritten the same way (``old`` -> ``new`` as a whole
identifier; the number as a whole token; each call with the old argument count given the same new
argument last) and nothing else changed. That continuation is unique by construction: regions whose
continuation would be ambiguous (a constant's definition, an already-updated header) are not
generated. Compared after ``strip_wrapper``, trailing whitespace per line and blank lines at either
end dropped (evaluation strips the reply, so the first line's indentation is not compared).

Split rule: the file's first function name hashed into 10% is test-only. ``held-out`` uses layouts
never trained on (apply_edit.choose_layout) and directory names never trained on.
``next_edit_made_up`` is the same task with every identifier a made-up word, in every split.
"""

from __future__ import annotations

import difflib
import random
import re

from ..edit_format import CURSOR, NEXT_EDIT_SYSTEM, NextEditRequest, Snippet, next_edit_message
from .apply_edit import choose_layout, normalize, split_key
from .base import Item, Task, in_split
from .codegen import (
    LANGS,
    Const,
    Func,
    Layout,
    Program,
    Writer,
    est_tokens,
    gen_program,
    render,
)
from .edits import fresh_var, local_names

KINDS = ("rename", "literal", "param")
DIRS = ["src", "lib", "app", "pkg", "utils", "internal", "common", "api"]
HELD_DIRS = ["core", "services", "modules", "engine"]
MAX_ANSWER = 190  # estimated tokens of the region
# estimated tokens of file + history + snippets: the system prompt, the template and the section
# tags take ~240 tokens and ~56 more per snippet, so prompt and answer stay within max_len 1,000
MAX_CONTEXT = 480
PER_SNIPPET = 56


def blocks_of(lines: list[str]) -> list[tuple[int, int]]:
    """[start, end) of each run of non-blank lines."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(lines):
        if lines[i].strip():
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def word_re(token: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\w.])" + re.escape(token) + r"(?![\w.])")


def diff(path: str, a: list[str], b: list[str], context: int = 1) -> str:
    lines = difflib.unified_diff(a, b, fromfile=path, tofile=path, n=context, lineterm="")
    return "\n".join(lines)


class Plan:
    """A started edit: which lines need it, how one line is rewritten, lines the region must avoid."""

    def __init__(self, lines: list[str], todo: list[int], fix: dict[int, str], avoid: set[int]):
        self.lines, self.todo, self.fix, self.avoid = lines, todo, fix, avoid


def plan_rename(rng: random.Random, prog: Program, layout: Layout, lines: list[str]) -> Plan | None:
    w = Writer(prog.lang, layout)
    f = rng.choice(prog.funcs())
    head = w.func(f, set())[0]
    if head not in lines:
        return None
    start = lines.index(head)
    end = next(e for s, e in blocks_of(lines) if s <= start < e)
    old_name = rng.choice(local_names(f))
    old, new = w.ident(old_name, "var"), w.ident(fresh_var(rng, prog), "var")
    pat = word_re(old)
    todo = [i for i in range(start, end) if pat.search(lines[i])]
    fix = {i: pat.sub(new, lines[i]) for i in todo}
    return Plan(lines, todo, fix, set(range(0, start)) | set(range(end, len(lines))))


def plan_literal(
    rng: random.Random, prog: Program, layout: Layout, lines: list[str]
) -> Plan | None:
    consts = [b for b in prog.blocks if isinstance(b, Const) and b.value[0] == "n"]
    const_lines = {
        i for i, x in enumerate(lines) for c in consts if x in Writer(prog.lang, layout).const(c)
    }
    counts: dict[str, list[int]] = {}
    for i, x in enumerate(lines):
        if i in const_lines:
            continue
        for m in set(re.findall(r"(?<![\w.])\d+(?![\w.])", x)):
            counts.setdefault(m, []).append(i)
    reps = sorted(v for v, ls in counts.items() if len(ls) >= 2)
    if not reps:
        return None
    value = rng.choice(reps)
    named = [c for c in consts if str(c.value[1]) == value]
    if named and rng.random() < 0.5:
        new = Writer(prog.lang, layout).ident(named[0].name, "const")
    else:
        present = set(re.findall(r"\d+", "\n".join(lines)))
        new = rng.choice(
            [n for n in ("4", "8", "15", "30", "40", "75", "99", "128", "500") if n not in present]
        )
    pat = word_re(value)
    todo = counts[value]
    fix = {i: pat.sub(new, lines[i]) for i in todo}
    avoid = {i for i in const_lines if pat.search(lines[i])}
    return Plan(lines, todo, fix, avoid)


def add_param(prog: Program, layout: Layout, f: Func, extra: tuple[str, ...]) -> str:
    g = Func(f.name, [*f.params, extra], f.lists, f.body)
    return Writer(prog.lang, layout).func(g, set())[0]


def plan_param(rng: random.Random, prog: Program, layout: Layout, lines: list[str]) -> Plan | None:
    w = Writer(prog.lang, layout)
    helper = prog.funcs()[0]
    head = w.func(helper, set())[0]
    if head not in lines:
        return None
    name = w.ident(helper.name, "func")
    call = re.compile(r"(?<![\w.])" + re.escape(name) + r"\(([^()]*)\)")
    arity = len(helper.params)
    arg = str(rng.choice([1, 2, 3, 5, 10, 100]))

    def fix_line(x: str) -> str:
        def one(m: re.Match[str]) -> str:
            n = len([a for a in m.group(1).split(",") if a.strip()])
            return f"{name}({m.group(1)}, {arg})" if n == arity else m.group(0)

        return call.sub(one, x)

    h = lines.index(head)
    extra = fresh_var(rng, prog)
    todo = [i for i, x in enumerate(lines) if i != h and fix_line(x) != x]
    fix = {i: fix_line(lines[i]) for i in todo}
    fix[h] = add_param(prog, layout, helper, extra)
    return Plan(lines, [h, *todo], fix, {h})


PLANS = {"rename": plan_rename, "literal": plan_literal, "param": plan_param}


def with_second_call(rng: random.Random, prog: Program) -> None:
    """The caller (second function) calls the helper (first) once more."""
    helper, caller = prog.funcs()[:2]
    args = [("v", rng.choice([p for p in caller.params if p not in caller.lists] or caller.params))]
    args = args * len(helper.params)
    acc = caller.body[0][1]
    caller.body.insert(
        rng.randint(1, len(caller.body) - 1), ("add", acc, "+", ("c", helper.name, args))
    )


def region_bounds(
    rng: random.Random, plan: Plan, current: list[str], rest: list[int]
) -> tuple[int, int]:
    """The region ``[lo, hi)``: every remaining line, a little context, none to avoid, 3-10 lines
    where the file allows (the caller rejects the rest)."""

    def ok(i: int) -> bool:
        return 0 <= i < len(plan.lines) and i not in plan.avoid and bool(current[i].strip())

    span = rest[-1] + 1 - rest[0]
    pad = rng.randint(max(0, 3 - span), max(0, min(4, 10 - span)))
    before = rng.randint(0, pad)
    lo, hi = rest[0], rest[-1] + 1
    for _ in range(before):
        lo -= ok(lo - 1)
    for _ in range(pad - before):
        hi += ok(hi)
    while hi - lo < 3 and (ok(lo - 1) or ok(hi)):
        lo, hi = (lo - 1, hi) if ok(lo - 1) else (lo, hi + 1)
    return lo, hi


class NextEdit(Task):
    strata = KINDS
    max_answer_tokens = 192

    def __init__(self, name: str = "next_edit", made_up: bool = False) -> None:
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
            if kind == "literal":
                lits = rng.sample([10, 12, 20, 25, 50, 64, 100, 255], 2)
                prog = gen_program(rng, lang, lits=[lits[0], lits[0], lits[1]], small=True, most=2)
            elif kind == "param":
                prog = gen_program(rng, lang, n_funcs=2, helper=True, small=True, most=0)
                with_second_call(rng, prog)
            else:
                prog = gen_program(rng, lang, small=True, most=2)
            if not in_split(("next_edit", split_key(prog)), split):
                continue
            canon = render(prog, Layout(LANGS[lang].indents[0]))
            if not 6 <= len(canon) <= 16:
                continue
            wr = random.Random(w.random())  # the wording draws a fixed amount from ``w``
            layout, feats = choose_layout(wr, lang, split, phrasing, prog.words(), self.made_up)
            lines = render(prog, layout)
            plan = PLANS[kind](rng, prog, layout, lines)
            if plan is None:
                continue
            item = self._item(rng, wr, lang, kind, plan, split, phrasing, layout)
            if item is not None:
                item.data.update(key=split_key(prog), layout=feats)
                return item

    def _item(
        self,
        rng: random.Random,
        w: random.Random,
        lang: str,
        kind: str,
        plan: Plan,
        split: str,
        phrasing: str,
        layout: Layout,
    ) -> Item | None:
        lines, todo = plan.lines, plan.todo
        done = 2 if kind == "param" or (len(todo) >= 4 and rng.random() < 0.5) else 1
        if len(todo) <= done:
            return None
        history_lines, rest = todo[:done], todo[done:]
        dirs = HELD_DIRS if split == "test" and phrasing == "held-out" else DIRS
        ext = LANGS[lang].ext
        path = f"{w.choice(dirs)}/{rng.choice(['main', 'calc', 'store', 'views', 'jobs'])}.{ext}"
        states = [list(lines)]
        for i in history_lines:
            s = list(states[-1])
            s[i] = plan.fix[i]
            states.append(s)
        current = states[-1]
        ctx = 1 if done == 1 else 0  # two diffs come without context lines (the budget)
        history = "\n".join(diff(path, a, b, ctx) for a, b in zip(states, states[1:]))

        lo, hi = region_bounds(rng, plan, current, rest)
        region_idx = range(lo, hi)
        if any(i in plan.avoid for i in region_idx) or not 3 <= len(region_idx) <= 10:
            return None
        region = current[lo:hi]
        expected = [plan.fix[i] if i in rest else current[i] for i in region_idx]
        # the cursor: before the first remaining change, or at the end of the region's first line
        k = rest[0] - lo
        first = region[k]
        col = next((j for j, (x, y) in enumerate(zip(first, expected[k])) if x != y), len(first))
        if rng.random() < 0.4:
            region[0] = region[0] + CURSOR
        else:
            region[k] = first[:col] + CURSOR + first[col:]
        n_recent = 0 if kind == "param" else rng.choice([0, 0, 1, 1, 2])
        recent = [self._snippet(rng, w, lang, dirs, layout, 3 - n_recent) for _ in range(n_recent)]
        req = NextEditRequest(
            recent=recent,
            path=path,
            above="\n".join(current[:lo]),
            region="\n".join(region),
            below="\n".join(current[hi:]),
            history=history,
        )
        answer = "\n".join(expected)
        context = "\n".join([*current, history, *(s.path + "\n" + s.code for s in recent)])
        budget = MAX_CONTEXT - PER_SNIPPET * len(recent)
        if est_tokens(lang, answer) > MAX_ANSWER or est_tokens(lang, context) > budget:
            return None
        messages = [
            {"role": "system", "content": NEXT_EDIT_SYSTEM},
            {"role": "user", "content": next_edit_message(req)},
        ]
        return Item(
            self.name,
            messages,
            answer=answer,
            stratum=kind,
            data={"expected": answer, "lang": lang, "path": path},
        )

    def _snippet(
        self,
        rng: random.Random,
        w: random.Random,
        lang: str,
        dirs: list[str],
        layout: Layout,
        most: int,
    ) -> Snippet:
        prog = gen_program(rng, lang, n_funcs=1)
        lines = render(prog, Layout(layout.indent))
        s, e = rng.choice(blocks_of(lines))
        stem = "_".join(prog.funcs()[0].name)
        return Snippet(
            f"{w.choice(dirs)}/{stem}.{LANGS[lang].ext}", "\n".join(lines[s : min(e, s + most)])
        )

    def verify(self, item: Item, reply: str) -> bool:
        return normalize(reply) == normalize(item.data["expected"])
