"""JSON-schema ``pattern`` under ``strict``: a documented regular-expression subset compiled to an
NFA over characters, run inside the byte-level JSON string machine of a slot.

The subset (ECMA-262 syntax, as JSON Schema uses): literals; ``.``; classes ``[a-z0-9_]`` and
``[^...]`` with ranges and escapes; ``\\d \\D \\w \\W \\s \\S``; escaped metacharacters and
``\\n \\r \\t \\f \\v \\uXXXX``; groups ``(...)`` and ``(?:...)``; alternation ``|``; the greedy
quantifiers ``* + ? {n} {n,} {n,m}`` (counts up to ``MAX_REPEAT``); ``^`` and ``$`` at the two ends
only. As in JSON Schema a pattern is not anchored: without ``^`` (``$``) any text may come before
(after) the match. Anything else — back-references, look-around, ``\\b``, named groups, lazy
quantifiers, Unicode properties — is a ``SchemaError`` (HTTP 400) naming what is unsupported.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ...errors import ConfigError
from .grammar import ESCAPES, Machine, State, _utf8_lead

MAX_REPEAT = 32  # the largest count of a {n,m} quantifier
MAX_NFA_STATES = 4096
Ranges = tuple[tuple[int, int], ...]
DIGIT: Ranges = ((0x30, 0x39),)
WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x2028, 0x2029), (0xFEFF, 0xFEFF))
CLASSES = {"d": (DIGIT, False), "D": (DIGIT, True), "w": (WORD, False), "W": (WORD, True)}
CLASSES |= {"s": (SPACE, False), "S": (SPACE, True)}
CONTROL = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0"}
JSON_ESCAPE = {
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    '"': '"',
    "\\": "\\",
    "/": "/",
}
META = set("\\^$.|?*+()[]{}/-")


class PatternError(ConfigError):
    """A pattern outside the supported subset (raised as the schema error it is)."""


@dataclass(frozen=True)
class CharSet:
    ranges: Ranges
    negated: bool = False

    def has(self, c: int) -> bool:
        return any(lo <= c <= hi for lo, hi in self.ranges) != self.negated

    def covers(self, lo: int, hi: int) -> str:
        """Whether every code point in ``lo..hi`` is in the set ("all"), none is ("none"), or some."""
        inside = 0
        last = lo - 1
        for a, b in sorted(self.ranges):
            a, b = max(a, last + 1), min(b, hi)
            if a <= b:
                inside += b - a + 1
                last = b
        if self.negated:
            inside = hi - lo + 1 - inside
        return "all" if inside == hi - lo + 1 else "none" if inside == 0 else "some"


ANY = CharSet((), True)  # ECMA "." minus line terminators
DOT = CharSet(((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)), True)


@dataclass
class NFA:
    eps: list[list[int]] = field(default_factory=list)
    edges: list[list[tuple[CharSet, int]]] = field(default_factory=list)
    start: int = 0
    accept: int = 0

    def node(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise PatternError(f"the pattern compiles to more than {MAX_NFA_STATES} states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def closure(self, states: set[int] | frozenset[int]) -> frozenset[int]:
        seen, stack = set(states), list(states)
        while stack:
            for t in self.eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)

    def step(self, states: frozenset[int], c: int) -> frozenset[int]:
        return self.closure({t for s in states for cs, t in self.edges[s] if cs.has(c)})


class _Parser:
    """Recursive descent over the subset, building Thompson fragments (start, end) in ``nfa``."""

    def __init__(self, text: str, nfa: NFA) -> None:
        self.s, self.i, self.nfa = text, 0, nfa

    def fail(self, what: str) -> PatternError:
        return PatternError(f"pattern {self.s!r}: {what} is outside the supported regex subset")

    def peek(self) -> str | None:
        return self.s[self.i] if self.i < len(self.s) else None

    def take(self) -> str:
        c = self.s[self.i]
        self.i += 1
        return c

    def edge(self, cs: CharSet) -> tuple[int, int]:
        a, b = self.nfa.node(), self.nfa.node()
        self.nfa.edges[a].append((cs, b))
        return a, b

    def empty(self) -> tuple[int, int]:
        a, b = self.nfa.node(), self.nfa.node()
        self.nfa.eps[a].append(b)
        return a, b

    def alt(self) -> tuple[int, int]:
        frags = [self.concat()]
        while self.peek() == "|":
            self.take()
            frags.append(self.concat())
        if len(frags) == 1:
            return frags[0]
        a, b = self.nfa.node(), self.nfa.node()
        for x, y in frags:
            self.nfa.eps[a].append(x)
            self.nfa.eps[y].append(b)
        return a, b

    def concat(self) -> tuple[int, int]:
        frag = self.empty()
        while self.peek() not in (None, "|", ")"):
            nxt = self.repeat()
            self.nfa.eps[frag[1]].append(nxt[0])
            frag = (frag[0], nxt[1])
        return frag

    def repeat(self) -> tuple[int, int]:
        start = self.i
        frag = self.atom()
        c = self.peek()
        if c not in ("*", "+", "?", "{"):
            return frag
        lo, hi = self.counts()
        if self.peek() in ("?", "+"):
            raise self.fail("a lazy or possessive quantifier")
        return self.repeated(frag, lo, hi, start)

    def counts(self) -> tuple[int, int | None]:
        c = self.take()
        if c in "*+?":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        end = self.s.find("}", self.i)
        body = self.s[self.i : end] if end >= 0 else ""
        parts = body.split(",")
        if end < 0 or len(parts) > 2 or not all(p.isdigit() for p in parts if p) or not parts[0]:
            raise self.fail("a malformed {n,m} quantifier")
        self.i = end + 1
        lo = int(parts[0])
        hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
        if (hi is not None and hi < lo) or max(lo, hi or 0) > MAX_REPEAT:
            raise self.fail(f"a count above {MAX_REPEAT} or out of order")
        return lo, hi

    def repeated(
        self, frag: tuple[int, int], lo: int, hi: int | None, start: int
    ) -> tuple[int, int]:
        """``frag`` (the atom parsed at ``start``) repeated lo..hi times: lo copies in a row, then
        hi - lo optional ones (or, unbounded, one that loops); further copies re-parse the atom."""
        copies = iter([frag])
        out = self.empty()

        def take() -> tuple[int, int]:
            return next(copies, None) or self.copy(start)

        def then(x: int, y: int) -> None:
            nonlocal out
            self.nfa.eps[out[1]].append(x)
            out = (out[0], y)

        for _ in range(lo):
            then(*take())
        if hi is None:
            x, y = take()
            a = self.nfa.node()
            self.nfa.eps[a] += [x]
            self.nfa.eps[y] += [a]
            then(a, a)
        else:
            end = self.nfa.node()
            for _ in range(hi - lo):
                self.nfa.eps[out[1]].append(end)  # stop here
                then(*take())
            then(end, end)
        return out

    def copy(self, start: int) -> tuple[int, int]:
        save = self.i
        self.i = start
        frag = self.atom()
        self.i = save
        return frag

    def atom(self) -> tuple[int, int]:
        c = self.take()
        if c == "(":
            if self.s.startswith("?:", self.i):
                self.i += 2
            elif self.peek() == "?":
                raise self.fail("look-around or a named group")
            frag = self.alt()
            if self.peek() != ")":
                raise self.fail("an unclosed group")
            self.take()
            return frag
        if c == "[":
            return self.edge(self.klass())
        if c == ".":
            return self.edge(DOT)
        if c == "\\":
            return self.edge(self.escape(in_class=False))
        if c in "*+?{":
            raise self.fail(f"a quantifier {c!r} with nothing to repeat")
        if c in "^$":
            raise self.fail(f"{c!r} inside the pattern (anchors only at its ends)")
        if c in ")]}":
            raise self.fail(f"an unmatched {c!r}")
        return self.edge(CharSet(((ord(c), ord(c)),)))

    def escape(self, in_class: bool) -> CharSet:
        if self.peek() is None:
            raise self.fail("a trailing backslash")
        c = self.take()
        if c in CLASSES and not in_class:
            r, neg = CLASSES[c]
            return CharSet(r, neg)
        if c in CONTROL:
            return CharSet(((ord(CONTROL[c]),) * 2,))
        if c == "u" and all(ch in "0123456789abcdefABCDEF" for ch in self.s[self.i : self.i + 4]):
            code = int(self.s[self.i : self.i + 4], 16)
            self.i += 4
            return CharSet(((code, code),))
        if c in META:
            return CharSet(((ord(c), ord(c)),))
        raise self.fail(f"the escape \\{c}")

    def klass(self) -> CharSet:
        neg = self.peek() == "^"
        if neg:
            self.take()
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            if self.peek() is None:
                raise self.fail("an unclosed character class")
            c = self.take()
            if c == "]" and not first:
                return CharSet(tuple(ranges), neg)
            first = False
            if c == "\\" and self.peek() in CLASSES:
                r, inner_neg = CLASSES[self.take()]
                if inner_neg:
                    raise self.fail("a negated class escape inside [...]")
                ranges += r
                continue
            lo = self.escape(True).ranges[0][0] if c == "\\" else ord(c)
            if self.peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.take()
                h = self.take()
                hi = self.escape(True).ranges[0][0] if h == "\\" else ord(h)
                if hi < lo:
                    raise self.fail("a range out of order")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))


def compile_pattern(pattern: str) -> NFA:
    """The pattern as an NFA over code points (unanchored ends get any-text loops)."""
    if not isinstance(pattern, str):
        raise PatternError("pattern must be a string")
    nfa = NFA()
    text = pattern
    head = text.startswith("^")
    tail = text.endswith("$") and not text.endswith("\\$")
    text = text[1 if head else 0 : len(text) - 1 if tail else len(text)]
    p = _Parser(text, nfa)
    a, b = p.alt()
    if p.i != len(text):
        raise p.fail(f"an unmatched {text[p.i]!r}")
    if not head:
        nfa.edges[a].append((ANY, a))  # anything before the match
    if not tail:
        nfa.edges[b].append((ANY, b))  # ... and after it
    nfa.start, nfa.accept = a, b
    return nfa


class PatternBody(Machine):
    """A JSON string after its opening quote through the closing quote, whose decoded characters
    match ``nfa`` (JSON escapes and UTF-8 decoded first); ``lo``/``hi`` bound the characters."""

    def __init__(self, nfa: NFA, lo: int = 0, hi: int | None = None) -> None:
        self.nfa, self.lo, self.hi = nfa, lo, hi
        self._start = nfa.closure({nfa.start})

    def starts(self) -> tuple[State, ...]:
        return ((self._start, 0, None),)

    def _char(self, states: frozenset[int], n: int, c: int) -> tuple[State, ...]:
        if self.hi is not None and n >= self.hi:
            return ()
        nxt = self.nfa.step(states, c)
        return ((nxt, self._count(n), None),) if nxt else ()

    def _count(self, n: int) -> int:
        return n + 1 if self.hi is not None else min(n + 1, self.lo)  # saturate when unbounded

    def _span(self, states: frozenset[int], lo: int, hi: int) -> frozenset[int] | str | None:
        """Stepping the NFA by any code point of ``lo..hi``: the same next states for all of them,
        ``"none"`` when no edge takes any, or None when it depends on which (keep reading)."""
        targets = set()
        for s in states:
            for cs, t in self.nfa.edges[s]:
                cov = cs.covers(lo, hi)
                if cov == "some":
                    return None
                if cov == "all":
                    targets.add(t)
        return self.nfa.closure(targets) if targets else "none"

    def _multi(
        self, states: frozenset[int], n: int, pend: int, lo: int, hi: int, cp: int
    ) -> tuple[State, ...]:
        """Inside a UTF-8 character with ``pend`` bytes to come and the code point's high bits ``cp``:
        decided at once when every completion steps the NFA alike (no state per byte value)."""
        if self.hi is not None and n >= self.hi:
            return ()
        width = 6 * pend
        got = self._span(states, cp << width, (cp << width) | ((1 << width) - 1))
        if got == "none":
            return ()
        if isinstance(got, frozenset):
            return ((got, self._count(n), ("skip", pend, lo, hi)),)
        return ((states, n, ("cp", pend, lo, hi, cp)),)

    def step(self, s: State, b: int) -> tuple[State, ...]:
        if s == "closed":
            return ()
        assert isinstance(s, tuple)
        states, n, mode = s
        if mode == "esc":
            ch = JSON_ESCAPE.get(chr(b)) if b in ESCAPES else None
            return self._char(states, n, ord(ch)) if ch else ()
        if mode is not None:  # a continuation byte
            kind, pend, lo, hi = mode[:4]
            if not lo <= b <= hi:
                return ()
            if kind == "skip":  # the NFA has stepped already
                return ((states, n, None if pend == 1 else ("skip", pend - 1, 0x80, 0xBF)),)
            cp = (mode[4] << 6) | (b & 0x3F)
            if pend == 1:
                return self._char(states, n, cp)
            return self._multi(states, n, pend - 1, 0x80, 0xBF, cp)
        if b == 0x22:
            ok = n >= self.lo and self.nfa.accept in states
            return ("closed",) if ok else ()
        if b == 0x5C:
            return ((states, n, "esc"),)
        if b < 0x20 or 0x80 <= b < 0xC2 or b > 0xF4:
            return ()
        if b < 0x80:
            return self._char(states, n, b)
        lead = _utf8_lead(b)
        assert lead is not None
        pend, lo, hi = lead
        return self._multi(states, n, pend, lo, hi, b & (0x3F >> pend))

    def accepts(self, s: State) -> bool:
        return s == "closed"

    def shortest(self) -> str | None:
        """A shortest matching string of printable ASCII within the length bounds (None if there is
        none); its JSON text sizes the slot."""
        cap = self.hi if self.hi is not None else self.lo

        def key(states: frozenset[int], n: int) -> tuple[frozenset[int], int]:
            return states, min(n, cap) if self.hi is None else n

        start = key(self._start, 0)
        prev: dict[tuple[frozenset[int], int], tuple[tuple[frozenset[int], int], str] | None] = {
            start: None
        }
        q = deque([start])
        while q:
            cur = q.popleft()
            states, n = cur
            if n >= self.lo and self.nfa.accept in states:
                out = []
                back = prev[cur]
                while back is not None:
                    out.append(back[1])
                    back = prev[back[0]]
                return "".join(reversed(out))
            if self.hi is not None and n >= self.hi:
                continue
            for c in range(0x20, 0x7F):
                nxt = self.nfa.step(states, c) if c not in (0x22, 0x5C) else frozenset()
                k = key(nxt, n + 1)
                if nxt and k not in prev:
                    prev[k] = (cur, chr(c))
                    q.append(k)
        return None


def pattern_body(pattern: str, lo: int = 0, hi: int | None = None) -> PatternBody:
    return PatternBody(compile_pattern(pattern), lo, hi)
