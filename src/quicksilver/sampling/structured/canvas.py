"""Structured output at decoding time: a compiled layout (``constrained.py``) laid out on the canvas
as prefilled skeleton tokens plus value slots; the decoder's ``Constraint`` that grammar-checks every
commit inside a slot (with token healing at slot ends); and the two token-set constraints the server
uses besides (ban a few ids, or allow only a few).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .constrained import Budgets, Piece, SchemaError, Slot
from .grammar import MANY, MAX_MASK_STATES, SlotGrammar, State, TokenTrie, token_trie


@dataclass
class StructuredCanvas:
    """A canvas layout: its length, the prefilled skeleton, and the constraint over the slots."""

    length: int
    prefill: dict[int, int]
    constraint: SlotConstraint


def build_canvas(pieces: Sequence[Piece], tokenizer: Any, pad_id: int) -> StructuredCanvas:
    """Tokenize the skeleton (adjacent literal text merged) and place the slots after it."""
    trie = token_trie(tokenizer)
    prefill: dict[int, int] = {}
    slots: list[tuple[int, int, SlotGrammar]] = []
    pos, text = 0, ""

    def flush() -> None:
        nonlocal pos, text
        for t in tokenizer.encode(text) if text else []:
            prefill[pos] = t
            pos += 1
        text = ""

    n_slots = 0
    closers: list[list[tuple[int, int | None]]] = []
    for i, p in enumerate(pieces):
        if isinstance(p, str):
            text += p
            continue
        flush()
        if isinstance(p, list):
            for t in p:
                prefill[pos] = int(t)
                pos += 1
        else:
            n_slots += 1
            slots.append((pos, p.budget, p.grammar(trie, pad_id)))
            closers.append(_closers(pieces[i + 1 :], tokenizer, trie))
            pos += p.budget
    flush()
    if n_slots > Budgets.max_slots:
        raise SchemaError(
            f"the schema has {n_slots} value slots; at most {Budgets.max_slots} are supported"
        )
    return StructuredCanvas(pos, prefill, SlotConstraint(slots, pos, closers))


_HEAL: OrderedDict[tuple[int, bytes], list[tuple[int, int | None]]] = OrderedDict()


def _closers(
    rest: Sequence[Piece], tokenizer: Any, trie: TokenTrie
) -> list[tuple[int, int | None]]:
    """Token healing at a slot's end. A BPE model often spells the end of a value and the start of
    the skeleton after it as one token (``"}`` = ``"`` + ``}``), which the slot cannot take. For every
    token ``a + b`` whose tail ``b`` starts the skeleton text after the slot, return ``(token, a's
    id)`` — or ``(token, None)`` when the token lies wholly in the skeleton, meaning "the value is
    over": at decoding time such a token's probability is moved to ``a`` (or to PAD)."""
    follow = b""
    for p in rest:
        if isinstance(p, Slot):
            break
        follow += (
            p.encode()
            if isinstance(p, str)
            else tokenizer.decode(p, skip_special_tokens=False).encode()
        )
    if not follow:
        return []
    key = (id(trie), follow)
    if key not in _HEAL:
        pairs: list[tuple[int, int | None]] = []
        for tid, data in trie.bytes_of.items():
            for k in range(len(data)):
                if follow.startswith(data[k:]):
                    if k == 0:
                        pairs.append((tid, None))
                    else:
                        a = trie.exact(data[:k])
                        if a is not None:
                            pairs.append((tid, a))
                    break
        _HEAL[key] = pairs
        while len(_HEAL) > 256:
            _HEAL.popitem(last=False)
    return _HEAL[key]


class SlotConstraint:
    """The decoder's ``Constraint``: grammar-checked unmasking over independent slots."""

    def __init__(
        self,
        slots: list[tuple[int, int, SlotGrammar]],
        length: int,
        closers: list[list[tuple[int, int | None]]] | None = None,
    ) -> None:
        self.slots = slots
        self.closers = closers or [[] for _ in slots]
        # healing pairs as tensors (source token, target token; -1 = the slot's PAD)
        self._pairs = [
            (
                torch.tensor([t for t, _ in c], dtype=torch.long),
                torch.tensor([-1 if a is None else a for _, a in c], dtype=torch.long),
            )
            for c in self.closers
        ]
        self.slot_of = [-1] * length
        for k, (start, budget, _) in enumerate(slots):
            for p in range(start, start + budget):
                self.slot_of[p] = k

    def _tokens(self, row: Any, k: int) -> list[int | None]:
        start, budget, _ = self.slots[k]
        canvas, committed = (
            row.canvas[start : start + budget].tolist(),
            row.committed[start : start + budget].tolist(),
        )
        return [t if c else None for t, c in zip(canvas, committed)]

    @staticmethod
    def _completable(g: SlotGrammar, toks: list[int | None]) -> Any:
        """co(j, s): can state ``s`` before offset j be completed given the slot's tokens from j on?"""
        memo: dict[tuple[int, State], bool] = {}
        free_from = len(toks)  # toks[free_from:] are all masked
        while free_from > 0 and toks[free_from - 1] is None:
            free_from -= 1

        def co(j: int, s: State) -> bool:
            if j >= free_from:
                return g.dist(s) <= len(toks) - j
            key = (j, s)
            if key not in memo:
                t = toks[j]
                nxt = g.bot(s) if t is None else g.next(s, t)
                memo[key] = any(co(j + 1, n) for n in nxt)
            return memo[key]

        return co

    def allow(self, row: Any, pos: int, token: int) -> bool:
        k = self.slot_of[pos] if 0 <= pos < len(self.slot_of) else -1
        if k < 0:
            return False  # skeleton positions are prefilled; nothing else lies on this canvas
        start, _, g = self.slots[k]
        if pos > start and not bool(row.committed[start:pos].all()):
            # a slot is written left to right (slots still fill in parallel): committed out of order, a
            # value's end (the closing quote) lands at the end of its budget and junk fills the gap,
            # because the model never learned where PAD goes inside JSON
            return False
        toks = self._tokens(row, k)
        toks[pos - start] = int(token)
        co = self._completable(g, toks)
        return any(co(0, s) for s in g.starts())

    def mask_logits(self, row: Any, lo: int, logits: torch.Tensor) -> torch.Tensor:
        n, V = logits.shape  # (hi - lo, V)
        allowed = torch.ones(n, V, dtype=torch.bool)
        done: dict[int, tuple[list[int | None], list[frozenset[State]], Any]] = {}
        committed = row.committed[lo : lo + n].tolist()
        for i in range(n):
            pos = lo + i
            k = self.slot_of[pos] if pos < len(self.slot_of) else -1
            if k < 0 or committed[i]:
                continue  # skeleton (prefilled) or already committed: not sampled from
            start, budget, g = self.slots[k]
            if k not in done:
                toks = self._tokens(row, k)
                done[k] = (toks, self._forward(g, toks), self._completable(g, toks))
            toks, fwd, co = done[k]
            j = pos - start
            if len(fwd[j]) > MAX_MASK_STATES or MANY in fwd[j]:
                continue  # too many reachable states to enumerate cheaply; allow() checks each commit
            ids: list[int] = []
            if all(t is None for t in toks[j + 1 :]):
                for s in fwd[j]:
                    ids += g.allowed_free(s, budget - j - 1)
            else:
                for s in fwd[j]:
                    for nxt, group in g.groups(s):
                        if any(co(j + 1, t) for t in nxt):
                            ids += group
            row_ok = torch.zeros(V, dtype=torch.bool)
            if ids:
                idx = torch.tensor(ids, dtype=torch.long)
                row_ok[idx[idx < V]] = True
            allowed[i] = row_ok
            self._heal(logits[i], row_ok, self._pairs[k], g.pad)
        return logits.masked_fill(~allowed.to(logits.device), float("-inf"))

    @staticmethod
    def _heal(
        logits: torch.Tensor, ok: torch.Tensor, pairs: tuple[torch.Tensor, torch.Tensor], pad: int
    ) -> None:
        """Move the probability of tokens that run into the skeleton to the token (or PAD) that ends
        the value, where that one is allowed and they are not (logits (V,) of one position, in place)."""
        src, dst = pairs
        if not src.numel():
            return
        V = logits.shape[0]
        dst = torch.where(dst < 0, torch.full_like(dst, pad), dst)
        keep = (src < V) & (dst < V)
        src, dst = src[keep], dst[keep]
        keep = ok[dst] & ~ok[src]
        if not bool(keep.any()):
            return
        src, dst = src[keep], dst[keep]
        m = torch.maximum(logits[src].max(), logits[dst].max())
        if not torch.isfinite(m):
            return
        # (V,)
        mass = torch.zeros(V, dtype=logits.dtype).index_add_(0, dst, (logits[src] - m).exp())
        tgt = dst.unique()
        logits[tgt] = torch.log((logits[tgt] - m).exp() + mass[tgt]) + m

    @staticmethod
    def _forward(g: SlotGrammar, toks: list[int | None]) -> list[frozenset[State]]:
        """Sets of states before each slot offset (index j: after toks[:j]); stops growing past a cap."""
        sets = [g.starts()]
        for t in toks:
            cur: set[State] = set()
            prev = sets[-1]
            if len(prev) > MAX_MASK_STATES and t is None:
                sets.append(frozenset((MANY,)))  # unknown from here on: mask_logits skips it
                continue
            for s in prev:
                if s == MANY:
                    cur.add(s)
                    continue
                cur |= g.bot(s) if t is None else g.next(s, t)
            sets.append(frozenset(cur))
        return sets


class BanTokens:
    """A constraint that forbids some tokens everywhere (e.g. ``<tool_call>`` with tool_choice none)."""

    def __init__(self, banned: Iterable[int]) -> None:
        self.banned = sorted(set(int(t) for t in banned))

    def allow(self, row: Any, pos: int, token: int) -> bool:
        return int(token) not in self.banned

    def mask_logits(self, row: Any, lo: int, logits: torch.Tensor) -> torch.Tensor:
        if self.banned:
            logits[:, self.banned] = float("-inf")
        return logits


class AllowTokens:
    """A constraint that allows only some tokens (e.g. ``<tool_call>`` or a stop: does a call follow?)."""

    def __init__(self, allowed: Iterable[int]) -> None:
        self.allowed = frozenset(int(t) for t in allowed)
        self._ids = torch.tensor(sorted(self.allowed), dtype=torch.long)

    def allow(self, row: Any, pos: int, token: int) -> bool:
        return int(token) in self.allowed

    def mask_logits(self, row: Any, lo: int, logits: torch.Tensor) -> torch.Tensor:
        keep = torch.full_like(logits, float("-inf"))  # (n, V)
        ids = self._ids[self._ids < logits.shape[1]].to(logits.device)
        keep[:, ids] = logits[:, ids]
        return keep
