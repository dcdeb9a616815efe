"""``POST /v1/messages`` (and ``/v1/messages/count_tokens``), Anthropic's Messages API, on the chat
path: the request becomes the chat completion it means (``to_chat``: ``system`` a system message,
``tool_use`` blocks the assistant's tool calls, ``tool_result`` blocks tool messages, ``any`` is
``required``), is planned by the one turn planner with the Messages API's field names, and runs on
the same runners; only the output shape differs. Tool calls are decoded on their schema canvas, so
every ``tool_use.input`` validates against its ``input_schema`` and text blocks never hold call
markup. ``thinking`` sets the reasoning phase's budget; its text comes back as ``thinking`` blocks
(with an empty ``signature``: nothing is signed).

Streams carry the API's typed events: ``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (stop reason, usage) and
``message_stop``; an error after the first event is one ``error`` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from ..protocol.base import diffusion_fields
from ..protocol.chat import ChatCompletionRequest
from ..protocol.errors import bad_request
from ..protocol.messages import Block, CountTokensRequest, MessagesRequest
from .chat import OpenAIServingChat, chat_request
from .generation import ChoiceResult, ChoiceRunner, Delta, Plan
from .planner import MESSAGES_FIELDS, TurnSpec
from .tools import ToolCall

TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _text(blocks: str | list[Block], where: str) -> str:
    """Text content: a string, or text blocks joined (anything else is a 400 naming it)."""
    if isinstance(blocks, str):
        return blocks
    for j, b in enumerate(blocks):
        if b.type != "text" or b.text is None:
            raise bad_request(
                f"content blocks of type {b.type!r} are not supported", f"{where}[{j}]"
            )
    return "".join(b.text or "" for b in blocks)


def _turns(role: str, blocks: list[Block], where: str) -> list[dict[str, object]]:
    """One Messages API message as chat messages: tool results first (one tool message each),
    then the text and, for the assistant, its tool calls."""
    out: list[dict[str, object]] = []
    text, calls = "", []
    for j, b in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if b.type == "text":
            text += b.text or ""
        elif b.type == "tool_use" and role == "assistant":
            args = json.dumps(b.input or {}, ensure_ascii=False)
            calls.append(
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}}
            )
        elif b.type == "tool_result" and role == "user":
            result = _text(b.content or "", f"{at}.content")
            content = f"Error: {result}" if b.is_error else result
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        elif b.type in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier reasoning is not replayed (the chat template drops it too)
        else:
            raise bad_request(f"{role} content blocks of type {b.type!r} are not supported", at)
    if text or calls or not out:
        out.append(
            {"role": role, "content": text or None, **({"tool_calls": calls} if calls else {})}
        )
    return out


def to_messages(req: CountTokensRequest) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system, "system")})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        else:
            out += _turns(m.role, m.content, f"messages[{i}]")
    return out


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The request as the chat completion it is planned as (a 400 for what it cannot carry)."""
    body: dict[str, object] = {"messages": to_messages(req), "model": req.model}
    if isinstance(req, MessagesRequest):
        if req.diffusing:
            raise bad_request("diffusing is not supported on /v1/messages", "diffusing")
        body |= diffusion_fields(req) | {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "temperature": req.temperature,
            "top_p": req.top_p,
        }
    for i, t in enumerate(req.tools or []):
        if t.type not in (None, "custom"):
            raise bad_request(f"server tools ({t.type}) are not supported", f"tools[{i}]")
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                },
            }
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise bad_request("tool_choice of type tool needs a name", "tool_choice.name")
            body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            body["tool_choice"] = TOOL_CHOICES[choice.type]
        body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    thinking = req.thinking is not None and req.thinking.type != "disabled"
    body["reasoning_effort"] = "medium" if thinking else "none"
    return chat_request(body, "messages")


def stop_reason(r: ChoiceResult) -> str:
    if r.tool_calls:
        return "tool_use"
    if r.finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if r.stop_string is not None else "end_turn"


def tool_use(call: ToolCall) -> dict[str, object]:
    fn = call["function"]
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": fn["name"],
        "input": json.loads(fn["arguments"]),
    }


def content_blocks(r: ChoiceResult) -> list[dict[str, object]]:
    """A finished choice as content blocks: thinking, text (unless only calls), tool uses."""
    out: list[dict[str, object]] = []
    if r.reasoning:
        out.append({"type": "thinking", "thinking": r.reasoning, "signature": ""})
    text = r.text.strip() if r.tool_calls else r.text
    if text or not r.tool_calls:
        out.append({"type": "text", "text": text})
    return out + [tool_use(c) for c in r.tool_calls]


class AnthropicServingMessages:
    """Builds on the chat serving: same planner, same runners, the Messages API's shapes."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    def check_model(self, model: str | None) -> None:
        self.chat.check_model(model)

    def spec(self, req: CountTokensRequest) -> TurnSpec:
        spec = self.chat.spec(to_chat(req), MESSAGES_FIELDS)
        spec.lower_max_tokens = True  # the API's max_tokens is a bound, and harnesses send 32k+
        t = req.thinking
        if t is not None and t.type != "disabled" and t.budget_tokens is not None:
            spec.effort = replace(spec.effort, reasoning=t.budget_tokens)
        return spec

    def plan(self, req: MessagesRequest) -> Plan:
        return self.chat.planner.plan(self.spec(req))

    def count_tokens(self, req: CountTokensRequest) -> dict[str, object]:
        """The prompt's tokens as the model would read it (tools and template included)."""
        spec = self.spec(req)
        return {"input_tokens": len(self.chat.planner.prompt(spec, spec.effort.reasoning > 0))}

    def message(self, plan: Plan, r: ChoiceResult, mid: str | None = None) -> dict[str, object]:
        return {
            "id": mid or f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": self.chat.served.name,
            "content": content_blocks(r),
            "stop_reason": stop_reason(r),
            "stop_sequence": r.stop_string,
            "usage": {"input_tokens": len(plan.prompt_ids), "output_tokens": r.completion_tokens},
        }

    async def create(self, req: MessagesRequest, arrival: float) -> dict[str, object]:
        plan = self.plan(req)
        (r,) = await self.chat.collect(self.chat.runners([plan], 1, None, arrival))
        return self.message(plan, r)

    def stream(self, req: MessagesRequest, arrival: float) -> AsyncGenerator[str, None]:
        plan = self.plan(req)  # errors here are plain HTTP errors, before the stream starts
        return self._stream(plan, self.chat.runners([plan], 1, None, arrival))

    async def _stream(self, plan: Plan, runners: list[ChoiceRunner]) -> AsyncGenerator[str, None]:
        mid = f"msg_{uuid.uuid4().hex}"
        ev = BlockEvents()
        result: ChoiceResult | None = None
        async for _, item in self.chat.merged(runners):
            if isinstance(item, BaseException):
                raise item
            if ev.index < 0:  # nothing is sent before the engine has taken the request
                head = self.message(plan, ChoiceResult(0), mid) | {
                    "content": [],
                    "stop_reason": None,
                }
                yield event("message_start", message=head)
                yield event("ping")
                ev.index = 0
            if isinstance(item, ChoiceResult):
                result = item
            else:
                for e in ev.delta(item):
                    yield e
        for e in ev.stop() if ev.index or ev.open else ev.empty_text():
            yield e
        assert result is not None
        delta = {"stop_reason": stop_reason(result), "stop_sequence": result.stop_string}
        yield event("message_delta", delta=delta, usage={"output_tokens": result.completion_tokens})
        yield event("message_stop")


def event(kind: str, **fields: object) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"


class BlockEvents:
    """The content-block events of one streamed message: the open block (``thinking`` or
    ``text``) takes deltas of its kind; any other delta closes it first."""

    def __init__(self) -> None:
        self.index = -1  # the open block's index (-1: the message has not started)
        self.open: str | None = None

    def empty_text(self) -> list[str]:
        """The one empty text block of a reply that wrote nothing (as the non-streamed shape)."""
        return self._start({"type": "text", "text": ""}) + self.stop()

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        self.index += 1
        return [event("content_block_stop", index=self.index - 1)]

    def _start(self, block: dict[str, Any]) -> list[str]:
        evs = self.stop()
        self.open = block["type"]
        return evs + [event("content_block_start", index=self.index, content_block=block)]

    def delta(self, d: Delta) -> list[str]:
        if d.kind == "reasoning":
            evs = (
                []
                if self.open == "thinking"
                else self._start({"type": "thinking", "thinking": "", "signature": ""})
            )
            return evs + [
                event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "thinking_delta", "thinking": d.text},
                )
            ]
        if d.kind == "content":
            evs = [] if self.open == "text" else self._start({"type": "text", "text": ""})
            return evs + [
                event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "text_delta", "text": d.text},
                )
            ]
        if d.kind == "tool_call" and d.call is not None:
            block = tool_use(d.call)
            args = json.dumps(block["input"], ensure_ascii=False)
            evs = self._start(block | {"input": {}})
            evs.append(
                event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "input_json_delta", "partial_json": args},
                )
            )
            return evs + self.stop()
        return []  # canvas views are not part of this API
