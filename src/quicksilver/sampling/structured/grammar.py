"""Byte-level grammars for grammar-checked unmasking: NFA combinators and their token-level view.

A ``Machine`` is a nondeterministic automaton over bytes with hashable states (``starts`` and
``step`` return epsilon-closed states): literals, JSON string bodies (valid UTF-8, escapes,
character-counted lengths), JSON numbers, sequences, alternatives and bounded repetition with a
separator — enough to express the JSON-schema subset in ``constrained.py``.

``SlotGrammar`` lifts a machine to tokens for one canvas slot whose language is ``VALUE PAD*``:
``trans`` walks the tokenizer's byte trie once per state (memoized), ``bot`` is the set of states
one unknown (masked) token can lead to — DINGO's mask-token transition (arXiv:2505.23061) — and
``dist`` is the fewest tokens to an accepting state, which answers "can this slot still be
completed in the positions left?" without enumerating completions.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

State = Hashable
PAD_STATE: State = ("<pad>",)


# ---- byte-level NFA combinators ------------------------------------------------------------------
def _pair(s: State) -> tuple[Any, Any]:
    assert isinstance(s, tuple) and len(s) == 2
    return s[0], s[1]


def _triple(s: State) -> tuple[str, int, State]:
    assert isinstance(s, tuple) and len(s) == 3
    return s[0], s[1], s[2]


class Machine:
    """An NFA over bytes with hashable states; ``starts``/``step`` return epsilon-closed states."""

    def starts(self) -> tuple[State, ...]:
        raise NotImplementedError

    def step(self, s: State, b: int) -> tuple[State, ...]:
        raise NotImplementedError

    def accepts(self, s: State) -> bool:
        raise NotImplementedError


class Lit(Machine):
    def __init__(self, text: str | bytes) -> None:
        self.literal = text.encode() if isinstance(text, str) else text

    def starts(self) -> tuple[State, ...]:
        return (0,)

    def step(self, s: State, b: int) -> tuple[State, ...]:
        assert isinstance(s, int)
        return (s + 1,) if s < len(self.literal) and self.literal[s] == b else ()

    def accepts(self, s: State) -> bool:
        return s == len(self.literal)


ESCAPES = frozenset(b'"\\/bfnrt')


def _utf8_lead(b: int) -> tuple[int, int, int] | None:
    """(continuation bytes still expected, allowed range of the next one) for a UTF-8 lead byte."""
    if 0xC2 <= b <= 0xDF:
        return (1, 0x80, 0xBF)
    if 0xE0 <= b <= 0xEF:
        return (2, 0xA0 if b == 0xE0 else 0x80, 0x9F if b == 0xED else 0xBF)
    if 0xF0 <= b <= 0xF4:
        return (3, 0x90 if b == 0xF0 else 0x80, 0x8F if b == 0xF4 else 0xBF)
    return None


class StrBody(Machine):
    """A JSON string after its opening quote, through the closing quote: valid UTF-8, no raw control
    characters, simple escapes; ``min_len``/``max_len`` count characters (as ``jsonschema`` does)."""

    def __init__(self, min_len: int = 0, max_len: int | None = None) -> None:
        self.lo, self.hi = min_len, max_len

    def starts(self) -> tuple[State, ...]:
        return ((0, None),)

    def step(self, s: State, b: int) -> tuple[State, ...]:
        if s == "closed":
            return ()
        assert isinstance(s, tuple)
        n, mode = s
        if mode == "esc":
            return ((n, None),) if b in ESCAPES else ()
        if mode is not None:  # inside a multi-byte character
            pend, lo, hi = mode
            if not lo <= b <= hi:
                return ()
            return ((n, None if pend == 1 else (pend - 1, 0x80, 0xBF)),)
        if b == 0x22:  # closing quote
            return ("closed",) if n >= self.lo else ()
        if b < 0x20 or 0x80 <= b < 0xC2 or b > 0xF4:
            return ()
        if self.hi is not None and n >= self.hi:
            return ()
        n2 = n + 1 if self.hi is not None else min(n + 1, self.lo)  # saturate when unbounded
        return ((n2, "esc" if b == 0x5C else _utf8_lead(b)),)

    def accepts(self, s: State) -> bool:
        return s == "closed"


_NUM = {  # JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    ("S", "-"): "M",
    ("S", "0"): "Z",
    ("S", "1"): "I",
    ("M", "0"): "Z",
    ("M", "1"): "I",
    ("I", "0"): "I",
    ("I", "1"): "I",
    ("Z", "."): "D",
    ("I", "."): "D",
    ("D", "0"): "F",
    ("D", "1"): "F",
    ("F", "0"): "F",
    ("F", "1"): "F",
    ("Z", "e"): "E",
    ("I", "e"): "E",
    ("F", "e"): "E",
    ("E", "-"): "G",
    ("E", "+"): "G",
    ("E", "0"): "X",
    ("E", "1"): "X",
    ("G", "0"): "X",
    ("G", "1"): "X",
    ("X", "0"): "X",
    ("X", "1"): "X",
}


MAX_INT_DIGITS = 15  # a number's digits before the point when the schema bounds none (< 2**53)
MAX_FRAC_DIGITS = 6  # ... after the point
MAX_EXP_DIGITS = 2  # ... of the exponent (only without minimum/maximum)
_PART = {"S": 0, "M": 0, "Z": 0, "I": 0, "D": 1, "F": 1, "E": 2, "G": 2, "X": 2}
_PREFIX = re.compile(r"-?((0|[1-9][0-9]*)(\.[0-9]*)?)?")
_COMPLETE = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?")


@dataclass(frozen=True)
class Bounds:
    """``minimum``/``maximum`` (``exclusive*`` when open); None is unbounded."""

    lo: Fraction | None = None
    hi: Fraction | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, x: Fraction) -> bool:
        if self.lo is not None and (x < self.lo or (self.lo_open and x == self.lo)):
            return False
        return self.hi is None or not (x > self.hi or (self.hi_open and x == self.hi))

    def witness(self, integer: bool) -> str | None:
        """A value within the bounds that ``Number`` can write (the one nearest zero), or None."""
        step = Fraction(1) if integer else Fraction(1, 10**MAX_FRAC_DIGITS)
        x = Fraction(0)
        if self.lo is not None and (self.lo > 0 or (self.lo == 0 and self.lo_open)):
            x = (self.lo // step) * step
            x += step if x < self.lo or self.lo_open else 0
        elif self.hi is not None and (self.hi < 0 or (self.hi == 0 and self.hi_open)):
            x = -((-self.hi) // step) * step
            x -= step if x > self.hi or self.hi_open else 0
        if not self.contains(x) or abs(x) >= 10**MAX_INT_DIGITS:
            return None
        if x.denominator == 1:
            return str(x.numerator)
        whole, frac = divmod(abs(x) * 10**MAX_FRAC_DIGITS, 10**MAX_FRAC_DIGITS)
        digits = str(int(frac)).rjust(MAX_FRAC_DIGITS, "0").rstrip("0")
        return ("-" if x < 0 else "") + f"{int(whole)}.{digits}"

    def meets(self, a: Fraction | None, b: Fraction | None, a_in: bool, b_in: bool) -> bool:
        """Does the interval from ``a`` to ``b`` (None: infinite; ``*_in``: closed) meet the bounds?"""
        lo, lo_in = (
            (a, a_in)
            if self.lo is None or (a is not None and a > self.lo)
            else (
                self.lo,
                not self.lo_open and (a is None or a < self.lo or a_in),
            )
        )
        hi, hi_in = (
            (b, b_in)
            if self.hi is None or (b is not None and b < self.hi)
            else (
                self.hi,
                not self.hi_open and (b is None or b > self.hi or b_in),
            )
        )
        if lo is None or hi is None:
            return True
        return lo < hi or (lo == hi and lo_in and hi_in)


class Number(Machine):
    """A JSON number (``integer``: no fraction, no exponent) with at most ``MAX_INT_DIGITS`` digits
    before the point, ``MAX_FRAC_DIGITS`` after and ``MAX_EXP_DIGITS`` in the exponent. With
    ``bounds`` there is no exponent, the state is the text so far, and a byte is taken only while
    some number within the bounds still starts with the text (the interval each prefix can reach)."""

    def __init__(
        self,
        integer: bool = False,
        bounds: Bounds | None = None,
        int_digits: int = MAX_INT_DIGITS,
        frac_digits: int = MAX_FRAC_DIGITS,
    ) -> None:
        self.integer, self.bounds = integer, bounds
        self.int_digits, self.frac_digits = int_digits, 0 if integer else frac_digits

    def starts(self) -> tuple[State, ...]:
        return ("",) if self.bounds is not None else (("S", 0),)

    def step(self, s: State, b: int) -> tuple[State, ...]:
        c = chr(b)
        if self.bounds is not None:
            assert isinstance(s, str)
            return (s + c,) if c in "0123456789-." and self._reachable(s + c) else ()
        st, n = _pair(s)
        cls = "0" if c == "0" else "1" if c.isdigit() and b < 0x80 else "e" if c in "eE" else c
        if self.integer and cls in (".", "e", "+"):
            return ()
        nxt = _NUM.get((str(st), cls))
        if nxt is None:
            return ()
        n = (n if _PART[nxt] == _PART[str(st)] else 0) + (cls in "01")
        cap = (self.int_digits, self.frac_digits, MAX_EXP_DIGITS)[_PART[nxt]]
        return ((nxt, n),) if n <= cap else ()

    def accepts(self, s: State) -> bool:
        if self.bounds is None:
            st, _ = _pair(s)
            return st in ("Z", "I", "F", "X")
        assert isinstance(s, str)
        return bool(_COMPLETE.fullmatch(s)) and self.bounds.contains(Fraction(s))

    def _reachable(self, p: str) -> bool:
        """Can ``p`` still be completed to a number within the bounds and the digit caps?"""
        if not _PREFIX.fullmatch(p):
            return False
        neg, body = p.startswith("-"), p.lstrip("-")
        whole, _, frac = body.partition(".")
        if len(whole) > self.int_digits or len(frac) > self.frac_digits:
            return False
        if "." in body and self.frac_digits == 0:
            return False
        spans: list[tuple[Fraction, Fraction, bool]] = []  # magnitudes [a, b] or [a, b)
        if not whole:
            spans.append((Fraction(0), Fraction(10) ** self.int_digits, False))
        elif "." in body:
            x = Fraction(whole + "." + frac) if frac else Fraction(whole)
            end = len(frac) >= self.frac_digits
            spans.append((x, x if end else x + Fraction(1, 10 ** len(frac)), end))
        else:
            d = int(whole)
            for k in range(0 if d == 0 else self.int_digits - len(whole) + 1):
                a, b = d * Fraction(10) ** k, (d + 1) * Fraction(10) ** k
                spans.append((a, b - 1, True) if self.integer else (a, b, self.frac_digits == 0))
            if d == 0:
                spans.append(
                    (Fraction(0), Fraction(0) if self.integer else Fraction(1), self.integer)
                )
        bounds = self.bounds
        assert bounds is not None
        for a, b, closed in spans:
            if neg and bounds.meets(-b, -a, closed, True):
                return True
            if not neg and bounds.meets(a, b, True, closed):
                return True
        return False


class LitSet(Machine):
    """One of several literals as a byte trie: a state is a trie node, so shared prefixes share
    states and a step is one lookup (an ``Alt`` of ``Lit``s keeps one live state per literal, which
    makes a large enum cost every decoding step time proportional to its size)."""

    def __init__(self, words: Sequence[str | bytes]) -> None:
        self.edges: list[dict[int, int]] = [{}]
        self.final: set[int] = set()
        for w in words:
            node = 0
            for b in w.encode() if isinstance(w, str) else w:
                nxt = self.edges[node].get(b)
                if nxt is None:
                    nxt = len(self.edges)
                    self.edges.append({})
                    self.edges[node][b] = nxt
                node = nxt
            self.final.add(node)

    def starts(self) -> tuple[State, ...]:
        return (0,)

    def step(self, s: State, b: int) -> tuple[State, ...]:
        assert isinstance(s, int)
        nxt = self.edges[s].get(b)
        return () if nxt is None else (nxt,)

    def accepts(self, s: State) -> bool:
        return s in self.final


class Seq(Machine):
    def __init__(self, parts: Sequence[Machine]) -> None:
        self.parts = list(parts)

    def _close(self, i: int, states: Iterable[State]) -> tuple[State, ...]:
        out: list[State] = []
        for s in states:
            out.append((i, s))
            if self.parts[i].accepts(s) and i + 1 < len(self.parts):
                out.extend(self._close(i + 1, self.parts[i + 1].starts()))
        return tuple(dict.fromkeys(out))

    def starts(self) -> tuple[State, ...]:
        return self._close(0, self.parts[0].starts())

    def step(self, s: State, b: int) -> tuple[State, ...]:
        i, inner = _pair(s)
        return self._close(i, self.parts[i].step(inner, b))

    def accepts(self, s: State) -> bool:
        i, inner = _pair(s)
        return i == len(self.parts) - 1 and self.parts[i].accepts(inner)


class Alt(Machine):
    def __init__(self, alts: Sequence[Machine]) -> None:
        self.alts = list(alts)

    def starts(self) -> tuple[State, ...]:
        return tuple((k, s) for k, m in enumerate(self.alts) for s in m.starts())

    def step(self, s: State, b: int) -> tuple[State, ...]:
        k, inner = _pair(s)
        return tuple((k, t) for t in self.alts[k].step(inner, b))

    def accepts(self, s: State) -> bool:
        k, inner = _pair(s)
        return self.alts[k].accepts(inner)


class Rep(Machine):
    """``item (sep item)*`` with lo <= count <= hi (hi None: unbounded; count saturates at lo)."""

    def __init__(self, item: Machine, sep: Machine, lo: int = 1, hi: int | None = None) -> None:
        self.item, self.sep, self.lo, self.hi = item, sep, max(lo, 1), hi

    def _close(self, phase: str, k: int, states: Iterable[State]) -> tuple[State, ...]:
        out: list[State] = []
        for s in states:
            out.append((phase, k, s))
            if phase == "i" and self.item.accepts(s) and (self.hi is None or k < self.hi):
                out.extend(self._close("s", k, self.sep.starts()))
            elif phase == "s" and self.sep.accepts(s):
                k2 = k + 1 if self.hi is not None else min(k + 1, self.lo)
                out.extend(self._close("i", k2, self.item.starts()))
        return tuple(dict.fromkeys(out))

    def starts(self) -> tuple[State, ...]:
        return self._close("i", 1, self.item.starts())

    def step(self, s: State, b: int) -> tuple[State, ...]:
        phase, k, inner = _triple(s)
        m = self.item if phase == "i" else self.sep
        return self._close(phase, k, m.step(inner, b))

    def accepts(self, s: State) -> bool:
        phase, k, inner = _triple(s)
        return phase == "i" and k >= self.lo and self.item.accepts(inner)


def opt(m: Machine) -> Machine:
    return Alt([Lit(b""), m])


SEP_COMMA = Seq([Lit(","), opt(Lit(" "))])
SEP_COLON = Seq([Lit(":"), opt(Lit(" "))])


def any_json(depth: int) -> Machine:
    """Any JSON value, containers nested at most ``depth`` deep."""
    alts: list[Machine] = [
        Seq([Lit('"'), StrBody()]),
        Number(),
        Lit("true"),
        Lit("false"),
        Lit("null"),
    ]
    if depth > 0:
        inner = any_json(depth - 1)
        alts.append(json_object(Seq([Lit('"'), StrBody(), SEP_COLON, inner])))
        alts.append(Seq([Lit("["), opt(Rep(inner, SEP_COMMA)), Lit("]")]))
    return Alt(alts)


def json_object(member: Machine, lo: int = 0) -> Machine:
    body = Rep(member, SEP_COMMA, lo=max(lo, 1))
    return Seq([Lit("{"), body if lo > 0 else opt(body), Lit("}")])


# ---- tokens as bytes ---------------------------------------------------------------------------------
def _byte_decoder() -> dict[str, int]:
    """Inverse of the byte-level BPE alphabet (printable bytes map to themselves, the rest to 256+)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenTrie:
    """Every ordinary token of a tokenizer as bytes, in a trie (special/added tokens are left out)."""

    def __init__(self, tokenizer: Any) -> None:
        fast = tokenizer.fast
        added = set(fast.get_added_tokens_decoder())
        byte_level = "ByteLevel" in type(fast.decoder).__name__ or "ByteLevel" in repr(fast.decoder)
        dec = _byte_decoder()
        self.root: dict[Any, Any] = {}
        self.vocab_size = int(tokenizer.vocab_size)
        self.bytes_of: dict[int, bytes] = {}  # token id -> its bytes (ordinary tokens only)
        for tid in range(self.vocab_size):
            if tid in added:
                continue
            piece = fast.id_to_token(tid)
            if piece is None:
                continue
            if byte_level and all(c in dec for c in piece):
                data = bytes(dec[c] for c in piece)
            else:
                data = tokenizer.decode([tid], skip_special_tokens=False).encode()
            if not data:
                continue
            self.bytes_of[tid] = data
            node = self.root
            for b in data:
                node = node.setdefault(b, {})
            node.setdefault(None, []).append(tid)

    def exact(self, data: bytes) -> int | None:
        """The id of a token spelling exactly ``data`` (None if there is none)."""
        node: dict[Any, Any] = self.root
        for b in data:
            if b not in node:
                return None
            node = node[b]
        ids = node.get(None)
        return ids[0] if ids else None


_TRIES: OrderedDict[int, tuple[Any, TokenTrie]] = OrderedDict()


def token_trie(tokenizer: Any) -> TokenTrie:
    """The tokenizer's trie, built once (a few recent tokenizers are kept, with a reference to each)."""
    key = id(tokenizer)
    hit = _TRIES.get(key)
    if hit is None or hit[0] is not tokenizer:
        _TRIES[key] = (tokenizer, TokenTrie(tokenizer))
        while len(_TRIES) > 4:
            _TRIES.popitem(last=False)
    return _TRIES[key][1]


class SlotGrammar:
    """Token-level view of one slot language ``VALUE PAD*``, with memoized transitions."""

    def __init__(self, machine: Machine, trie: TokenTrie, pad_id: int) -> None:
        self.m, self.trie, self.pad = machine, trie, pad_id
        self._trans: dict[State, dict[int, frozenset[State]]] = {}
        self._bot: dict[State, frozenset[State]] = {}
        self._groups: dict[State, list[tuple[frozenset[State], list[int]]]] = {}
        self._dist: dict[State, int] = {}
        self._free: dict[tuple[State, int], list[int]] = {}

    def starts(self) -> frozenset[State]:
        return frozenset(self.m.starts())

    def nbytes(self) -> int:
        """Estimated memory of the memoized tables (~96 bytes per entry: key, value, set slot)."""
        entries = sum(len(t) for t in list(self._trans.values()))
        entries += sum(len(v) for v in list(self._bot.values()))
        entries += sum(len(ids) for g in list(self._groups.values()) for _, ids in g)
        entries += sum(len(v) for v in list(self._free.values())) + len(self._dist)
        return 96 * entries

    def accepts(self, s: State) -> bool:
        return s == PAD_STATE or self.m.accepts(s)

    def trans(self, s: State) -> dict[int, frozenset[State]]:
        """token id -> next states, for every ordinary token the machine accepts from ``s``."""
        if s not in self._trans:
            out: dict[int, frozenset[State]] = {}
            if s != PAD_STATE:
                stack: list[tuple[dict[Any, Any], frozenset[State]]] = [
                    (self.trie.root, frozenset((s,)))
                ]
                while stack:
                    node, states = stack.pop()
                    for b, child in node.items():
                        if b is None:
                            continue
                        nxt = frozenset(t for st in states for t in self.m.step(st, b))
                        if nxt:
                            for tid in child.get(None, ()):
                                out[tid] = nxt
                            stack.append((child, nxt))
            self._trans[s] = out
        return self._trans[s]

    def next(self, s: State, tok: int) -> frozenset[State]:
        if tok == self.pad:
            return frozenset((PAD_STATE,)) if self.accepts(s) else frozenset()
        return self.trans(s).get(tok, frozenset())

    def bot(self, s: State) -> frozenset[State]:
        """States reachable from ``s`` by one unknown (masked) token."""
        if s not in self._bot:
            nxt: set[State] = set()
            for v in self.trans(s).values():
                nxt |= v
            if self.accepts(s):
                nxt.add(PAD_STATE)
            self._bot[s] = frozenset(nxt)
        return self._bot[s]

    def groups(self, s: State) -> list[tuple[frozenset[State], list[int]]]:
        """The tokens from ``s`` grouped by their next-state set (for building logit masks)."""
        if s not in self._groups:
            by: dict[frozenset[State], list[int]] = {}
            for tid, nxt in self.trans(s).items():
                by.setdefault(nxt, []).append(tid)
            if self.accepts(s):
                by.setdefault(frozenset((PAD_STATE,)), []).append(self.pad)
            self._groups[s] = list(by.items())
        return self._groups[s]

    def dist(self, s: State, limit: int = 4096) -> int:
        """Fewest tokens that take ``s`` to an accepting state (breadth-first; ``limit`` if none)."""
        if s not in self._dist:
            seen, frontier, d = {s}, [s], 0
            while frontier and d < limit:
                if any(self.accepts(t) for t in frontier):
                    break
                nxt = [u for t in frontier for u in self.bot(t) if u not in seen]
                seen.update(nxt)
                frontier, d = list(dict.fromkeys(nxt)), d + 1
            self._dist[s] = d if frontier else limit
        return self._dist[s]

    def allowed_free(self, s: State, rest: int) -> list[int]:
        """Tokens allowed from ``s`` when ``rest`` masked positions follow in the slot."""
        key = (s, rest)
        if key not in self._free:
            self._free[key] = [
                t
                for nxt, ids in self.groups(s)
                if any(self.dist(n) <= rest for n in nxt)
                for t in ids
            ]
        return self._free[key]


MANY: State = ("<many>",)
# mask_logits skips positions whose reachable-state set is larger (allow() still checks)
MAX_MASK_STATES = 24
