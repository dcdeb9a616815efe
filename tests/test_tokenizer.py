"""Tokenizer: byte-level round trip, special-token roles, sandboxed chat templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quicksilver.errors import CheckpointError, ConfigError
from quicksilver.tokenizer import Tokenizer


def test_round_trip_any_text() -> None:
    tok = Tokenizer.byte_level()
    for s in ["hello world", "naïve — ünïcödé ✓ 😀", "  spaces\tand\nnewlines ", '{"a": [1, 2]}']:
        assert tok.decode(tok.encode(s)) == s
    assert tok.mask_id == 2 and tok.eos_id == 1 and 4 in tok.stop_ids


def test_special_tokens_are_single_ids_and_hidden_on_decode() -> None:
    tok = Tokenizer.byte_level()
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><think>x</think>")
    assert ids[0] == 3 and 4 in ids and tok.token_to_id("<think>") in ids
    assert tok.decode(ids) == "user\nhi<think>x</think>"  # specials hidden, reasoning markers kept


def test_chat_template_renders_roles_tools_and_reasoning_switch() -> None:
    tok = Tokenizer.byte_level()
    msgs = [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    s = tok.apply_chat_template(msgs)
    assert (
        s
        == "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(msgs, reasoning=False).endswith(
        "<|im_start|>assistant\n<think></think>"
    )
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    s = tok.apply_chat_template(
        msgs
        + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        ],
        tools=tools,
    )
    assert "<tools>\n" + json.dumps(tools[0]) in s
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in s
    assert "<|im_start|>tool\n<tool_response>18C</tool_response><|im_end|>" in s


def test_template_sandbox_blocks_code(tmp_path: Path) -> None:
    tok = Tokenizer.byte_level()
    tok.save(tmp_path)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    evil = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ConfigError):
        evil.apply_chat_template([{"role": "user", "content": "x"}])
    cfg["chat_template"] = "{% for %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not compile"):
        Tokenizer.from_dir(tmp_path)


def test_trained_merges_shorten_text() -> None:
    corpus = ["the quick brown fox jumps over the lazy dog"] * 50
    tok = Tokenizer.byte_level(merges_from=corpus, vocab_size=320)
    s = "the quick brown fox"
    assert len(tok.encode(s)) < len(Tokenizer.byte_level().encode(s))
    assert tok.decode(tok.encode(s)) == s and tok.mask_id == 2
