"""Incremental detokenization (``tokenizers``' DecodeStream): deltas join to the full decode, never
split a character, and hold back an incomplete one until it completes or the stream ends."""

from __future__ import annotations

import random

from quicksilver.assets import embedded_model_path
from quicksilver.engine import IncrementalDetokenizer
from quicksilver.tokenizer import Tokenizer


def tokenizers() -> list[Tokenizer]:
    out = [Tokenizer.byte_level()]
    path = embedded_model_path()
    if path is not None:
        out.append(Tokenizer.from_dir(path))
    return out


def test_deltas_join_to_the_full_decode_and_never_split_a_character() -> None:
    text = 'Grüße, 世界! naïve café — ok 🙂 <tool_call>{"a": 1}</tool_call> done'
    rng = random.Random(0)
    for tok in tokenizers():
        ids = tok.encode(text) + [tok.pad_id or 0] + tok.encode(" end")
        for _ in range(5):
            d = IncrementalDetokenizer(tok)
            deltas, i = [], 0
            while i < len(ids):
                n = rng.randint(1, 4)
                deltas.append(d.push(ids[i : i + n]))
                i += n
            deltas.append(d.flush())
            assert "".join(deltas) == tok.decode(ids) == d.text
            assert all("\ufffd" not in x for x in deltas)


def test_an_incomplete_character_is_held_until_flush() -> None:
    tok = Tokenizer.byte_level()
    ids = tok.encode("é")  # two byte tokens
    assert len(ids) == 2
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[:1]) == ""
    assert d.flush() == "\ufffd"
    d = IncrementalDetokenizer(tok)
    assert d.push(ids[:1]) == "" and d.push(ids[1:]) == "é"
