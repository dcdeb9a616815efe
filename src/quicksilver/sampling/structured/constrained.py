"""Structured output for diffusion decoding: a JSON schema becomes a canvas skeleton plus value slots.

A diffusion canvas has a fixed length, and the decoder may commit positions in any order. So
instead of steering a left-to-right parser (what AR engines do), we lay the answer out up front:

* **Skeleton.** Everything the schema fixes — braces, keys, quotes, commas, constants — is
  tokenized and *prefilled* on the canvas (the decoder never masks or revises those positions).
  Objects with ``properties`` expand recursively into skeleton (every property, in schema order).
* **Slots.** Each free value (string body, number, boolean, enum, array, free-form object, a
  union) gets a run of masked positions: its *budget*. The slot's language is ``VALUE PAD*``:
  the model writes the value, then fills the rest with the tokenizer's pad token, which the
  detokenizer drops (a too-long value is impossible: the budget bounds it; a short one ends early).
* **Grammar-checked unmasking.** Each slot's value language is a small byte-level NFA built from
  combinators (literals, sequences, alternatives, bounded repetition, JSON strings and numbers).
  Because positions are committed out of order, a token may be committed only if the slot's
  partial assignment — committed tokens, masked holes, this token — can still be completed to a
  word of the language within the budget (additive infilling, as in Mündler et al. 2025,
  arXiv:2508.10111, reduced here to set propagation over a regular language in the spirit of
  DINGO's mask-token transitions, arXiv:2505.23061). ``mask_logits`` removes every token that
  fails that test at each masked slot position; ``allow`` re-checks each commit in order, so
  several commits in one step stay jointly consistent. The assignment is always completable, so
  decoding always progresses and the output always parses and validates — no retries.

Supported schema subset (anything else raises ``SchemaError`` when ``strict``; when not strict
the unsupported keywords are ignored): ``type`` (one or a list), ``properties``/``required``/
``additionalProperties`` (false, true or a schema), ``items``/``minItems``/``maxItems``,
``enum``, ``const``, ``anyOf``/``oneOf`` (as anyOf), ``minLength``/``maxLength``, ``pattern`` (the
regex subset of ``pattern.py``), ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``
(numbers and integers), local ``$ref`` into ``$defs``/``definitions``; annotations (``title``,
``description``, ``default``, ``format``, ...) are ignored. Strings allow the escapes
``\\" \\\\ \\/ \\b \\f \\n \\r \\t`` and no raw control characters.

Default caps, whatever the schema says: a number has at most ``MAX_INT_DIGITS`` (15) digits before
the point, ``MAX_FRAC_DIGITS`` (6) after it and a two-digit exponent (no exponent when bounded);
a string, array or free object is bounded by its slot budget in tokens (``Budgets``; the server's
``json_*_tokens``), and an array without ``maxItems`` by ``Budgets.array_items`` items' worth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from ...errors import ConfigError
from .grammar import (
    SEP_COLON,
    SEP_COMMA,
    Alt,
    Bounds,
    Lit,
    LitSet,
    Machine,
    Number,
    Rep,
    Seq,
    SlotGrammar,
    StrBody,
    TokenTrie,
    any_json,
    json_object,
    opt,
)
from .layout_cache import LAYOUT_CACHE_BYTES, ByteLRU
from .pattern import PatternError, pattern_body

ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "format",
        "readOnly",
        "writeOnly",
        "deprecated",
        "$defs",
        "definitions",
        "strict",
        "nullable",
    }
)
SUPPORTED = (
    frozenset(
        {
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "minItems",
            "maxItems",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "minLength",
            "maxLength",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "pattern",
            "$ref",
        }
    )
    | ANNOTATIONS
)


class SchemaError(ConfigError):
    """The schema uses something structured output cannot guarantee (HTTP 400)."""


# ---- schema -> layout ------------------------------------------------------------------------------
@dataclass
class Slot:
    machine: Machine
    budget: int
    _grammars: dict[tuple[int, int], SlotGrammar] = field(default_factory=dict, repr=False)

    def grammar(self, trie: TokenTrie, pad_id: int) -> SlotGrammar:
        """The token-level grammar, kept on the slot so cached layouts keep their memoized transitions."""
        key = (id(trie), pad_id)
        if key not in self._grammars:
            self._grammars[key] = SlotGrammar(self.machine, trie, pad_id)
        return self._grammars[key]


Piece = str | list[int] | Slot


@dataclass
class Budgets:
    """Token budgets of free value slots (the canvas is fixed-length; PAD fills what a value leaves)."""

    string: int = 24
    number: int = 12
    integer: int = 10
    free_object: int = 64
    array_items: int = 4  # items budgeted for an array without maxItems
    max_depth: int = 8
    max_slots: int = 64


@dataclass
class _Ctx:
    root: dict[str, Any]
    strict: bool
    budgets: Budgets
    encode: Any
    depth: int = 0
    refs: set[str] = field(default_factory=set)


def _resolve(schema: Any, ctx: _Ctx) -> dict[str, Any]:
    seen: set[str] = set()  # a chain of $ref that only points at other $refs
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        parts = ref.split("/") if isinstance(ref, str) else []
        if len(parts) != 3 or parts[0] != "#" or parts[1] not in ("$defs", "definitions"):
            raise SchemaError(
                f"only local $ref into #/$defs or #/definitions is supported, got {ref!r}"
            )
        target = ctx.root.get(parts[1], {}).get(parts[2])
        if target is None:
            raise SchemaError(f"$ref {ref!r} does not resolve")
        if ref in ctx.refs or ref in seen:
            raise SchemaError(f"recursive $ref {ref!r} is not supported")
        seen.add(ref)
        schema = target
    if schema is True or schema == {}:
        return {}
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object, got {json.dumps(schema)[:60]}")
    if ctx.strict:
        bad = sorted(set(schema) - SUPPORTED)
        if bad:
            raise SchemaError(
                f"schema keyword(s) {bad} cannot be enforced; drop them or set strict to false"
            )
    return schema


def _types(s: dict[str, Any]) -> list[str]:
    t = s.get("type")
    if t is None:
        if "properties" in s or "additionalProperties" in s:
            return ["object"]
        if "items" in s:
            return ["array"]
        return []
    ts = t if isinstance(t, list) else [t]
    for x in ts:
        if x not in ("object", "array", "string", "number", "integer", "boolean", "null"):
            raise SchemaError(f"unknown type {x!r}")
    return ts


def _dump(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def _choice(values: list[Any]) -> Machine:
    if not values:
        raise SchemaError("enum must list at least one value")
    return LitSet([_dump(v) for v in values])


def _machine(schema: Any, ctx: _Ctx) -> tuple[Machine, int]:
    """A machine for a whole value of ``schema`` and its token budget."""
    s = _resolve(schema, ctx)
    if ctx.depth > ctx.budgets.max_depth:
        raise SchemaError(f"schema nests deeper than {ctx.budgets.max_depth} levels")
    sub = _Ctx(ctx.root, ctx.strict, ctx.budgets, ctx.encode, ctx.depth + 1, ctx.refs)
    tok = lambda text: max(1, len(ctx.encode(text)))  # noqa: E731
    if "const" in s:
        return Lit(_dump(s["const"])), tok(_dump(s["const"]))
    if "enum" in s:
        return _choice(list(s["enum"])), max(tok(_dump(v)) for v in s["enum"])
    alts = s.get("anyOf") or s.get("oneOf")
    if alts:
        ms = [_machine(a, sub) for a in alts]
        return Alt([m for m, _ in ms]), max(b for _, b in ms)
    types = _types(s)
    if not types:
        return any_json(2), ctx.budgets.free_object
    if len(types) > 1:
        ms = [_machine({**s, "type": t}, sub) for t in types]
        return Alt([m for m, _ in ms]), max(b for _, b in ms)
    t = types[0]
    if t == "string" and "pattern" in s:
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        try:
            body = pattern_body(s["pattern"], lo, None if hi is None else int(hi))
        except PatternError as e:
            if ctx.strict:
                raise SchemaError(str(e)) from None
            return _machine({k: v for k, v in s.items() if k != "pattern"}, ctx)
        budget = ctx.budgets.string if hi is None else min(ctx.budgets.string, int(hi) + 1) + 1
        witness = body.shortest()
        need = len(ctx.encode('"' + witness)) + 1 if witness is not None else budget
        return Seq([Lit('"'), body]), max(budget, need, lo + 2)
    if t == "string":
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        budget = ctx.budgets.string if hi is None else min(ctx.budgets.string, int(hi) + 1) + 1
        return Seq([Lit('"'), StrBody(lo, None if hi is None else int(hi))]), max(budget, lo + 2)
    if t in ("number", "integer"):
        return _number(s, t == "integer", ctx)
    if t == "boolean":
        return _choice([True, False]), tok("false")
    if t == "null":
        return Lit("null"), tok("null")
    if t == "array":
        item, ib = _machine(s.get("items", {}), sub)
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        n = int(hi) if hi is not None else max(lo, ctx.budgets.array_items)
        items = Rep(item, SEP_COMMA, lo=max(lo, 1), hi=None if hi is None else int(hi))
        return Seq([Lit("["), items if lo > 0 else opt(items), Lit("]")]), 2 + n * (ib + 1)
    # object
    props: dict[str, Any] = s.get("properties") or {}
    _check_required(s, props, ctx)
    if props:
        parts: list[Machine] = [Lit("{")]
        budget = 2
        for i, (k, v) in enumerate(props.items()):
            if i:
                parts.append(SEP_COMMA)
            m, b = _machine(v, sub)
            parts += [Lit(_dump(k)), SEP_COLON, m]
            budget += tok(_dump(k)) + 3 + b
        parts.append(Lit("}"))
        return Seq(parts), budget
    extra = s.get("additionalProperties", True)
    if extra is False:
        return Lit("{}"), tok("{}")
    if extra is True or extra == {}:
        return json_object(
            Seq([Lit('"'), StrBody(), SEP_COLON, any_json(1)])
        ), ctx.budgets.free_object
    vm, vb = _machine(extra, sub)
    return (
        json_object(Seq([Lit('"'), StrBody(), SEP_COLON, vm])),
        min(ctx.budgets.free_object, 2 + ctx.budgets.array_items * (vb + 8)),
    )


def _bound(s: dict[str, Any], key: str) -> Fraction | None:
    v = s.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SchemaError(f"{key} must be a number, got {json.dumps(v)[:40]}")
    return Fraction(str(v)) if isinstance(v, float) else Fraction(v)


def _number(s: dict[str, Any], integer: bool, ctx: _Ctx) -> tuple[Machine, int]:
    """A number slot: the digit caps always, ``minimum``/``maximum``/``exclusive*`` when given."""
    budget = ctx.budgets.integer if integer else ctx.budgets.number
    lo, hi = _bound(s, "minimum"), _bound(s, "maximum")
    xlo, xhi = _bound(s, "exclusiveMinimum"), _bound(s, "exclusiveMaximum")
    lo_open = xlo is not None and (lo is None or xlo >= lo)
    hi_open = xhi is not None and (hi is None or xhi <= hi)
    if lo_open:
        lo = xlo
    if hi_open:
        hi = xhi
    if lo is None and hi is None:
        return Number(integer), budget
    bounds = Bounds(lo, hi, lo_open, hi_open)
    witness = bounds.witness(integer)
    if witness is None:
        raise SchemaError(f"no {'integer' if integer else 'number'} satisfies {_dump(s)[:80]}")
    return Number(integer, bounds), max(budget, len(ctx.encode(witness)) + 1)


def _check_required(s: dict[str, Any], props: dict[str, Any], ctx: _Ctx) -> None:
    missing = [r for r in s.get("required", []) if r not in props]
    if missing and (not props and s.get("additionalProperties", True) is not False):
        return  # free-form object: we cannot promise keys, but strict schemas always list them
    if missing:
        raise SchemaError(f"required properties {missing} are not in properties")


def _pieces(schema: Any, ctx: _Ctx) -> list[Piece]:
    """Skeleton expansion: objects with properties become literal text around their values."""
    s = _resolve(schema, ctx)
    if ctx.depth > ctx.budgets.max_depth:
        raise SchemaError(f"schema nests deeper than {ctx.budgets.max_depth} levels")
    types = _types(s)
    plain = not any(k in s for k in ("const", "enum", "anyOf", "oneOf"))
    sub = _Ctx(ctx.root, ctx.strict, ctx.budgets, ctx.encode, ctx.depth + 1, ctx.refs)
    if plain and types == ["object"] and s.get("properties"):
        props = s["properties"]
        _check_required(s, props, ctx)
        out: list[Piece] = ["{"]
        for i, (k, v) in enumerate(props.items()):
            out.append((", " if i else "") + _dump(k) + ": ")
            out += _pieces(v, sub)
        out.append("}")
        return out
    if "const" in s:
        return [_dump(s["const"])]
    if plain and types == ["null"]:
        return ["null"]
    if plain and types == ["string"]:
        m, b = _machine(s, ctx)
        assert isinstance(m, Seq)
        return ['"', Slot(m.parts[1], b - 1)]  # the opening quote is skeleton
    m, b = _machine(s, ctx)
    return [Slot(m, b)]


def schema_pieces(
    schema: Any, strict: bool, encode: Any, budgets: Budgets | None = None
) -> list[Piece]:
    """Compile a JSON schema into skeleton text and slots (raises SchemaError)."""
    if schema is None or schema == {}:
        schema = {"type": "object"}
    root = schema if isinstance(schema, dict) else {}
    return _pieces(schema, _Ctx(root, strict, budgets or Budgets(), encode))


def layout_nbytes(pieces: list[Piece]) -> int:
    """Estimated memory of a cached layout: its slots' memoized token-level transitions."""
    return sum(
        g.nbytes() for p in pieces if isinstance(p, Slot) for g in list(p._grammars.values())
    )


_CACHE: ByteLRU[list[Piece]] = ByteLRU(LAYOUT_CACHE_BYTES, layout_nbytes)


def compile_cached(key: str, build: Any) -> list[Piece]:
    """Compiled layouts in an LRU bounded by their estimated bytes (machines keep their memoized
    transitions between requests, which is what makes the bound grow)."""
    return _CACHE.get_or_build(key, build)
