"""Structured output: schemas compile to skeleton + slots, and decoding under them always yields JSON
that validates — on random-weight models (which write garbage without the constraint)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import quicksilver
from quicksilver.sampling import SamplerConfig
from quicksilver.sampling.structured.canvas import BanTokens, build_canvas
from quicksilver.sampling.structured.constrained import Budgets, SchemaError, Slot, schema_pieces
from quicksilver.sampling.structured.grammar import (
    SEP_COMMA,
    Alt,
    Lit,
    Number,
    Rep,
    Seq,
    SlotGrammar,
    StrBody,
    any_json,
    token_trie,
)
from quicksilver.tokenizer import Tokenizer

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "nights": {"type": "integer"},
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "bb", 3, None]},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "inner": {
                "type": "object",
                "properties": {"x": {"type": ["integer", "null"]}},
                "required": ["x"],
                "additionalProperties": False,
            },
            "free": {"type": "object"},
        },
        "required": ["city", "nights", "ok", "kind", "score", "tags", "inner", "free"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"a": {"type": "string", "maxLength": 5}},
            "required": ["a"],
        },
        "minItems": 1,
        "maxItems": 2,
    },
    {
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/pt"},
            "label": {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]},
        },
        "required": ["a", "label"],
        "additionalProperties": False,
    },
]


def accepts(machine, text: str) -> bool:  # type: ignore[no-untyped-def]
    states = set(machine.starts())
    for b in text.encode():
        states = {t for s in states for t in machine.step(s, b)}
    return any(machine.accepts(s) for s in states)


BOUNDED = {
    "type": "object",
    "properties": {
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "delta": {"type": "integer", "exclusiveMaximum": -5},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
        "n": {"type": "integer"},
    },
    "required": ["age", "score", "delta", "code", "n"],
    "additionalProperties": False,
}  # strict bounds: ranges, exclusive ends, a pattern, the default digit cap


def test_machines_accept_exactly_their_language() -> None:
    body = Seq([Lit('"'), StrBody()])
    for ok in ['""', '"abc"', '"a\\"b"', '"\\n\\t"', '"é漢"']:
        assert accepts(body, ok), ok
    for bad in ['"a', '"a"b', '"a\nb"', '"\\x"', "abc"]:
        assert not accepts(body, bad), bad
    num, integer = Number(), Number(integer=True)
    for ok in ["0", "-1", "12.5", "1e9", "-0.5E-3"]:
        assert accepts(num, ok), ok
    for bad in ["01", "1.", ".5", "-", "1e", "+1", "1.2.3"]:
        assert not accepts(num, bad), bad
    assert accepts(integer, "-42") and not accepts(integer, "4.2")
    arr = Seq([Lit("["), Rep(Number(integer=True), SEP_COMMA, lo=1, hi=2), Lit("]")])
    assert (
        accepts(arr, "[1]")
        and accepts(arr, "[1, 2]")
        and not accepts(arr, "[1,2,3]")
        and not accepts(arr, "[]")
    )
    assert (
        accepts(StrBody(2, 3), 'ab"')
        and not accepts(StrBody(2, 3), 'a"')
        and not accepts(StrBody(2, 3), 'abcd"')
    )
    assert accepts(any_json(3), '{"a": [1, {"b": null}]}') and not accepts(
        any_json(2), '{"a": [1, {"b": null}]}'
    )
    assert not accepts(any_json(2), '{"a": }')
    assert accepts(Alt([Lit("true"), Lit("false")]), "false")


def test_slot_grammar_distance_and_pad() -> None:
    tok = Tokenizer.byte_level()
    assert tok.pad_id is not None
    g = SlotGrammar(Seq([Lit('"'), StrBody()]), token_trie(tok), tok.pad_id)
    (s0,) = g.starts()
    assert g.dist(s0) == 2  # an opening and a closing quote
    quote = tok.encode('"')[0]
    s1 = g.next(s0, quote)
    assert s1 and not g.next(s0, tok.pad_id)  # no padding before the value is complete
    closed = {t for s in s1 for t in g.next(s, quote)}
    assert any(g.accepts(s) for s in closed) and all(
        g.next(s, tok.pad_id) for s in closed if g.accepts(s)
    )
    think = tok.token_to_id("<think>")
    assert all(think not in g.trans(s) for s in s1)  # special/added tokens never enter a value


def test_strict_rejects_what_it_cannot_enforce() -> None:
    tok = Tokenizer.byte_level()
    with pytest.raises(SchemaError, match="multipleOf"):
        schema_pieces(
            {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}},
            True,
            tok.encode,
        )
    with pytest.raises(SchemaError, match="look-around"):
        schema_pieces({"type": "string", "pattern": "^(?=a)a+$"}, True, tok.encode)
    with pytest.raises(SchemaError, match="no integer satisfies"):
        schema_pieces({"type": "integer", "minimum": 3, "maximum": 2}, True, tok.encode)
    with pytest.raises(SchemaError, match="ref"):
        schema_pieces({"$ref": "https://example.com/schema.json"}, True, tok.encode)
    with pytest.raises(SchemaError, match="required"):
        schema_pieces(
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
            True,
            tok.encode,
        )
    # not strict: unsupported keywords are ignored, the structure still holds
    pieces = schema_pieces(
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}},
        False,
        tok.encode,
    )
    assert pieces[:2] == ["{", '"n": '] and isinstance(pieces[2], Slot)


def test_skeleton_is_prefilled_and_slots_are_budgeted() -> None:
    tok = Tokenizer.byte_level()
    pieces = schema_pieces(SCHEMAS[0], True, tok.encode, Budgets(string=10))
    assert "".join(p for p in pieces[:3] if isinstance(p, str)) == '{"city": "' and isinstance(
        pieces[3], Slot
    )
    canvas = build_canvas(pieces, tok, tok.pad_id or 0)
    skeleton = tok.decode([canvas.prefill[p] for p in sorted(canvas.prefill)])
    for key in SCHEMAS[0]["properties"]:
        assert f'"{key}": ' in skeleton
    assert canvas.length > len(canvas.prefill)
    assert all(canvas.constraint.slot_of[p] == -1 for p in canvas.prefill)


def decode(
    pipe, schema, temperature: float, seed: int, prompt: str = "Give me JSON", draft: int = 3
):  # type: ignore[no-untyped-def]
    tok = pipe.tokenizer
    canvas = build_canvas(schema_pieces(schema, True, tok.encode), tok, tok.pad_id)
    cfg = SamplerConfig(
        max_new_tokens=canvas.length, temperature=temperature, seed=seed, threshold=0.5
    )
    if pipe.config.attention == "causal":  # drafts checked against the constrained distribution
        cfg = cfg.replace(policy="verify", draft=draft)
    row = pipe.decoder.new_row(
        pipe.encode_prompt(prompt, chat=True),
        cfg,
        prefill=canvas.prefill,
        constraint=canvas.constraint,
    )
    while not row.done:
        pipe.decoder.step([row])
    return tok.decode(row.result().tokens), row


@pytest.mark.parametrize("which", ["tiny_ckpt", "tiny_block_ckpt", "tiny_causal_ckpt"])
def test_decoding_under_a_schema_always_validates(
    which: str, request: pytest.FixtureRequest
) -> None:
    pipe = quicksilver.load(request.getfixturevalue(which))
    for schema in [*SCHEMAS, BOUNDED]:
        for temperature, seed in [(0.0, 0), (1.0, 1), (1.0, 2)]:
            text, row = decode(pipe, schema, temperature, seed)
            jsonschema.validate(json.loads(text), schema)
            if schema is BOUNDED:  # no bound given: the default cap of 15 digits
                assert abs(json.loads(text)["n"]) < 10**15
            assert (
                row.finish_reason == "length"
            )  # the canvas is the layout: it ends full, never early


def test_verify_under_a_schema_is_the_constrained_ar_output(tiny_causal_ckpt: Path) -> None:
    """Greedy drafts checked against the constrained causal logits: the constrained AR output."""
    pipe = quicksilver.load(tiny_causal_ckpt)
    for schema in SCHEMAS:
        assert decode(pipe, schema, 0.0, 0, draft=4)[0] == decode(pipe, schema, 0.0, 0, draft=0)[0]


def test_without_the_constraint_a_random_model_writes_no_json(tiny_ckpt: Path) -> None:
    """The check above can fail: the same model, unconstrained, does not produce valid JSON."""
    pipe = quicksilver.load(tiny_ckpt)
    res = pipe.generate("Give me JSON", chat=True, max_new_tokens=40, temperature=1.0, seed=1)
    with pytest.raises(json.JSONDecodeError):
        json.loads(res.text)


@pytest.mark.parametrize("which", ["tiny_ckpt", "tiny_causal_ckpt"])
def test_ban_tokens(which: str, request: pytest.FixtureRequest) -> None:
    pipe = quicksilver.load(request.getfixturevalue(which))
    free = pipe.generate(
        "hi", chat=True, max_new_tokens=24, temperature=1.0, seed=3, stop_at_eos=False
    ).tokens
    banned = sorted(set(free))[:5]
    cfg = SamplerConfig(max_new_tokens=24, temperature=1.0, seed=3, stop_at_eos=False)
    row = pipe.decoder.new_row(
        pipe.encode_prompt("hi", chat=True), cfg, constraint=BanTokens(banned)
    )
    while not row.done:
        pipe.decoder.step([row])
    assert not set(row.result().tokens) & set(banned)


def test_a_closing_token_means_the_value_ends_here() -> None:
    """Token healing at slot ends: a model that wants to write `"}` after a string body (one BPE
    token that the slot cannot take) has that probability moved to PAD, so the value ends cleanly
    instead of the slot being filled with whatever else is allowed."""
    from types import SimpleNamespace

    import torch

    tok = Tokenizer.byte_level(merges_from=['{"city": "Paris"}'] * 50, vocab_size=320)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    canvas = build_canvas(schema_pieces(schema, True, tok.encode), tok, tok.pad_id or 0)
    con = canvas.constraint
    start, budget, g = con.slots[0]
    closing = [t for t, a in con.closers[0] if a is not None and tok.decode([t]) == '"}']
    assert closing, "the tokenizer has a token spelling the string's end and the closing brace"
    row = SimpleNamespace(
        canvas=torch.full((canvas.length,), 2),
        committed=torch.zeros(canvas.length, dtype=torch.bool),
    )
    for p, t in canvas.prefill.items():
        row.canvas[p], row.committed[p] = t, True
    P = tok.encode("P")[0]
    row.canvas[start], row.committed[start] = P, True  # the value so far: "P"
    logits = torch.zeros(budget, tok.vocab_size)
    logits[1, closing] = 8.0  # the model's wish after "P": close the string
    logits[1, tok.encode("x")[0]] = 5.0  # the best token the slot can take
    out = con.mask_logits(row, start, logits.clone())
    assert tok.decode([int(out[1].argmax())]) == '"'  # the value ends with its closing quote
    plain = type(con)(con.slots, canvas.length)  # the same constraint without healing
    assert int(plain.mask_logits(row, start, logits.clone())[1].argmax()) == tok.encode("x")[0]


def test_revision_holes_inside_a_slot_do_not_stall_constrained_decoding(tmp_path: Path) -> None:
    """With revision on, a re-masked token inside a slot is a hole left of the next position; the
    decoder's fallback must fill the hole (slots are written left to right), not give up."""
    from quicksilver.models.init import init_model

    pipe = quicksilver.load(
        init_model(tmp_path / "m", "tiny", seed=3, attention="block_causal", block_size=16)
    )
    tok = pipe.tokenizer
    cv = build_canvas(
        schema_pieces(SCHEMAS[0], True, tok.encode, Budgets(string=8)), tok, tok.pad_id or 0
    )
    cfg = SamplerConfig(
        max_new_tokens=cv.length, threshold=0.01, revise_threshold=0.9, max_revisions=2
    )
    row = pipe.decoder.new_row(tok.encode("hi"), cfg, prefill=cv.prefill, constraint=cv.constraint)
    while not row.done:
        pipe.decoder.step([row])
    assert row.n_revisions > 0
    jsonschema.validate(json.loads(tok.decode(row.result().tokens)), SCHEMAS[0])
