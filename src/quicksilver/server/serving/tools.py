"""Tool calls: template input from OpenAI messages, the model's ``<tool_call>`` output parsed back,
and the layouts that force a call (``tool_choice`` required or named) under the tool's schema."""

from __future__ import annotations

import json
import re
import uuid
from typing import TypedDict

from ...sampling.structured.constrained import (
    Budgets,
    Piece,
    SchemaError,
    compile_cached,
    schema_pieces,
)
from ...tokenizer import Tokenizer
from ..protocol.chat import ChatMessage, Tool
from ..protocol.errors import bad_request
from ..reliability.limits import parse_json_bounded

CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


class FunctionCall(TypedDict):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(TypedDict):
    """An OpenAI tool call, as a chat completion's message carries it."""

    id: str
    type: str  # "function"
    function: FunctionCall


def message_text(m: ChatMessage) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = []
    for p in m.content:
        if p.type != "text" or p.text is None:
            raise bad_request(
                f"content parts of type {p.type!r} are not supported (text only; the server never "
                "fetches URLs or files)",
                "messages",
            )
        parts.append(p.text)
    return "".join(parts)


def template_messages(messages: list[ChatMessage]) -> list[dict[str, object]]:
    """OpenAI messages -> the chat template's input (tool-call arguments parsed into objects)."""
    out: list[dict[str, object]] = []
    for i, m in enumerate(messages):
        d: dict[str, object] = {"role": m.role, "content": message_text(m)}
        if m.role == "assistant":
            if m.reasoning_content or m.reasoning:
                d["reasoning_content"] = m.reasoning_content or m.reasoning
            calls = []
            for j, c in enumerate(m.tool_calls or []):
                where = f"messages[{i}].tool_calls[{j}].function.arguments"
                try:
                    args = parse_json_bounded(c.function.arguments or "{}", where)
                except json.JSONDecodeError:
                    raise bad_request(
                        "tool call arguments must be a JSON object string", where
                    ) from None
                calls.append(
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": args},
                    }
                )
            if calls:
                d["tool_calls"] = calls
        if m.role == "tool" and m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def tool_dicts(tools: list[Tool]) -> list[dict[str, object]]:
    return [t.model_dump(exclude_none=True, by_alias=True) for t in tools]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content or None, OpenAI tool_calls) from a reply; with no parsable call, the text unchanged.

    As vLLM's Hermes-style parser does, the content of a reply with calls is the text before the
    first call: what a model writes between or after its calls (a small model sometimes trails junk
    such as ``": "`` after ``</tool_call>``) is not an answer, since the turn ends in tool calls."""
    calls: list[ToolCall] = []
    first = None
    for m in CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                continue
        first = m.start() if first is None else first
        calls.append(
            {
                "id": new_call_id(),
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": json.dumps(args, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, calls
    return text[:first].strip() or None, calls


def forced_call_pieces(
    tools: list[Tool], name: str | None, tok: Tokenizer, budgets: Budgets
) -> list[Piece]:
    """The canvas of a forced call: ``<tool_call>{"name": ..., "arguments": <schema>}</tool_call>``.
    One tool (named or the only one): the arguments' skeleton is laid out; several: one slot whose
    grammar is the union of the tools' call objects."""
    chosen = [t for t in tools if name is None or t.function.name == name]
    if not chosen:
        raise bad_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")

    def params(t: Tool) -> dict[str, object]:
        return t.function.parameters or {"type": "object", "properties": {}}

    def build() -> list[Piece]:
        o, c = tok.token_to_id(OPEN_TAG), tok.token_to_id(CLOSE_TAG)
        head: list[Piece] = [[o]] if o is not None else [OPEN_TAG]
        tail: list[Piece] = [[c]] if c is not None else [CLOSE_TAG]
        try:
            if len(chosen) == 1:
                t = chosen[0]
                strict = bool(t.function.strict)
                body = schema_pieces(params(t), strict, tok.encode, budgets)
                return (
                    head
                    + ['{"name": ' + json.dumps(t.function.name) + ', "arguments": ']
                    + body
                    + ["}"]
                    + tail
                )
            union = {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"name": {"const": t.function.name}, "arguments": params(t)},
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    }
                    for t in chosen
                ]
            }
            return head + schema_pieces(union, False, tok.encode, budgets) + tail
        except SchemaError as e:
            raise bad_request(f"tool schema: {e}", "tools") from None

    key = json.dumps([tool_dicts(chosen), name, budgets.__dict__, id(tok)], sort_keys=True)
    return compile_cached(key, build)
