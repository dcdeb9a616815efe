"""Task items as model input: through the chat template into prompt and answer ids, or into the
OpenAI wire format for the served paths.

An answer is ``<think>working</think>reply<|im_end|>`` (or just ``reply<|im_end|>`` in instant mode,
where the prompt pre-fills an empty ``<think></think>`` as the template does for
``reasoning=False``); raw fill-in-the-middle prompts end with ``<|endoftext|>``.
"""

from __future__ import annotations

import json
from typing import Any

from ..tokenizer import Tokenizer
from .tasks import Item

IM_END = "<|im_end|>"
EOT = "<|endoftext|>"


def answer_text(item: Item, instant: bool) -> str:
    """The target reply as text (no stop token)."""
    if not item.is_chat or instant:
        return item.answer
    return f"<think>{item.reasoning}</think>{item.answer}"


def prompt_text(item: Item, tokenizer: Tokenizer, instant: bool) -> str:
    if not item.is_chat:
        assert item.raw_prompt is not None
        return item.raw_prompt
    kw = {"reasoning": False} if instant else {}
    return tokenizer.apply_chat_template(
        item.messages or [], tools=item.tools, add_generation_prompt=True, **kw
    )


def render(item: Item, tokenizer: Tokenizer, instant: bool = False) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids ending in the stop token)."""
    stop = tokenizer.token_to_id(IM_END if item.is_chat else EOT)
    assert stop is not None
    return tokenizer.encode(prompt_text(item, tokenizer, instant)), tokenizer.encode(
        answer_text(item, instant)
    ) + [stop]


def to_openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task suite's messages in the wire format: tool-call arguments as JSON strings, with ids."""
    out = []
    for i, m in enumerate(messages):
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for j, c in enumerate(m["tool_calls"]):
                fn = dict(c.get("function", c))
                args = fn.get("arguments", {})
                fn["arguments"] = args if isinstance(args, str) else json.dumps(args)
                calls.append(
                    {
                        "id": c.get("id") or f"call_{i}_{j}",
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": fn["arguments"]},
                    }
                )
            m["tool_calls"] = calls
        if m.get("role") == "tool" and not m.get("tool_call_id"):
            m["tool_call_id"] = f"call_{i - 1}_0"
        out.append(m)
    return out
