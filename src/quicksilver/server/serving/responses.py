"""``POST /v1/responses``: the OpenAI Responses API on the chat path.

A request becomes a ``ChatCompletionRequest`` (``to_chat``: ``instructions`` a system message,
``input`` items messages, ``function_call`` / ``function_call_output`` items an assistant turn's
calls and tool turns, ``text.format`` the response format, ``reasoning.effort`` the effort), so it
is planned, budgeted and decoded exactly as a chat completion. The output is a list of items —
``reasoning``, ``message`` (``output_text``), ``function_call`` — and a stream is the typed event
sequence (``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` … ``response.completed``), each
event with its ``sequence_number``.

``store`` is never honoured: the server keeps no responses (every response says ``"store": false``),
so ``previous_response_id`` is a 400 — send the conversation as input items instead.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from ..protocol.base import diffusion_fields
from ..protocol.chat import ChatCompletionRequest
from ..protocol.errors import bad_request
from ..protocol.responses import ResponseNamedTool, ResponsesRequest
from .chat import OpenAIServingChat, chat_request
from .generation import ChoiceResult, ChoiceRunner
from .planner import RESPONSES_FIELDS
from .tools import ToolCall

ROLES = ("user", "system", "developer", "assistant")


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") not in (
                "input_text",
                "output_text",
                "text",
            ):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise bad_request(
                    f"content parts of type {kind!r} are not supported (text only)", where
                )
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise bad_request("content must be a string or a list of text parts", where)


def to_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` as chat messages; consecutive ``function_call`` items join the
    assistant turn before them."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise bad_request(f"role must be one of {list(ROLES)}, got {role!r}", where)
            out.append({"role": role, "content": _text(item.get("content", ""), where)})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
            }
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant" or last.get("tool_calls") is None:
                if last is not None and last["role"] == "assistant":
                    last["tool_calls"] = []
                else:
                    last = {"role": "assistant", "content": None, "tool_calls": []}
                    out.append(last)
            last["tool_calls"].append(call)
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _text(output, where)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # earlier reasoning is not replayed (the chat template drops it too)
        else:
            raise bad_request(f"input items of type {kind!r} are not supported", where)
    return out


def to_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    """The request as the chat completion it is planned as (a 400 for what it cannot carry)."""
    if req.previous_response_id:
        raise bad_request(
            "this server stores no responses (store is not supported); send the whole "
            "conversation as input items",
            "previous_response_id",
        )
    body: dict[str, object] = {
        "messages": to_messages(req),
        "model": req.model,
        "max_completion_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls,
        "seed": req.seed,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "logprobs": bool(req.top_logprobs),
        "top_logprobs": req.top_logprobs,
    }
    body |= diffusion_fields(req)
    if req.reasoning is not None and req.reasoning.effort is not None:
        body["reasoning_effort"] = req.reasoning.effort
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, str):
        body["tool_choice"] = req.tool_choice
    elif req.tool_choice is not None:
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        js = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict}
        body["response_format"] = {"type": "json_schema", "json_schema": js}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    return chat_request(body, "input")


def new_item(kind: str) -> dict[str, object]:
    """An output item being streamed (reasoning or message), with a fresh id."""
    prefix = {"reasoning": "rs", "message": "msg"}[kind]
    item: dict[str, object] = {"id": f"{prefix}_{uuid.uuid4().hex}", "type": kind}
    if kind == "reasoning":
        item.update(summary=[], content=[])
    else:
        item.update(status="in_progress", role="assistant", content=[])
    return item


def function_item(call: ToolCall) -> dict[str, object]:
    """A decoded chat tool call as a Responses ``function_call`` item."""
    return {
        "id": f"fc_{uuid.uuid4().hex}",
        "type": "function_call",
        "status": "completed",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }


def output_text(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OpenAIServingResponses:
    """Builds on the chat serving: same plan, same runners, another output shape."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    def _response(
        self,
        req: ResponsesRequest,
        rid: str,
        created: int,
        status: str,
        output: list[dict[str, object]],
        r: ChoiceResult | None,
        prompt_tokens: int,
    ) -> dict[str, object]:
        usage = None
        if r is not None:
            usage = {
                "input_tokens": prompt_tokens,
                "input_tokens_details": {"cached_tokens": r.cached_tokens},
                "output_tokens": r.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": r.reasoning_tokens},
                "total_tokens": prompt_tokens + r.completion_tokens,
            }
        incomplete = r is not None and r.finish_reason == "length"
        return {
            "id": rid,
            "object": "response",
            "created_at": created,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.chat.served.name,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {
                "effort": req.reasoning.effort if req.reasoning else None,
                "summary": None,
            },
            "store": False,
            "temperature": req.temperature,
            "text": {"format": {"type": "text"}}
            if req.text is None
            else req.text.model_dump(by_alias=True, exclude_none=True),
            "tool_choice": req.tool_choice.model_dump()
            if isinstance(req.tool_choice, ResponseNamedTool)
            else (req.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
            "top_p": req.top_p,
            "truncation": req.truncation or "disabled",
            "usage": usage,
            "metadata": req.metadata or {},
            "user": req.user,
        }

    def output(self, r: ChoiceResult) -> list[dict[str, object]]:
        """A finished choice as output items: reasoning, the message (unless only calls), calls."""
        out: list[dict[str, object]] = []
        if r.reasoning:
            out.append(
                {
                    "id": f"rs_{uuid.uuid4().hex}",
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": r.reasoning}],
                }
            )
        text = r.text.strip() if r.tool_calls else r.text
        if text or not r.tool_calls:
            out.append(
                {
                    "id": f"msg_{uuid.uuid4().hex}",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [output_text(text)],
                }
            )
        out += [function_item(c) for c in r.tool_calls]
        return out

    async def create(self, req: ResponsesRequest, arrival: float) -> dict[str, object]:
        plan = self.chat.plan(to_chat(req), RESPONSES_FIELDS)
        (r,) = await self.chat.collect(self.chat.runners([plan], 1, req.seed, arrival))
        rid, created = f"resp_{uuid.uuid4().hex}", int(time.time())
        return self._response(
            req, rid, created, "completed", self.output(r), r, len(plan.prompt_ids)
        )

    def stream(self, req: ResponsesRequest, arrival: float) -> AsyncGenerator[str, None]:
        plan = self.chat.plan(to_chat(req), RESPONSES_FIELDS)  # errors here are plain HTTP errors
        runners = self.chat.runners([plan], 1, req.seed, arrival)
        return self._stream(req, runners, len(plan.prompt_ids))

    async def _stream(
        self, req: ResponsesRequest, runners: list[ChoiceRunner], prompt_tokens: int
    ) -> AsyncGenerator[str, None]:
        rid, created = f"resp_{uuid.uuid4().hex}", int(time.time())
        ev = StreamEvents()
        pending = self._response(req, rid, created, "in_progress", [], None, prompt_tokens)
        yield ev.event("response.created", response=pending)
        yield ev.event("response.in_progress", response=pending)
        result: ChoiceResult | None = None
        async for _, item in self.chat.merged(runners):
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, ChoiceResult):
                result = item
            elif item.kind in ("reasoning", "content"):
                for e in ev.text(item.kind, item.text):
                    yield e
            elif item.kind == "tool_call" and item.call is not None:
                for e in ev.call(item.call):
                    yield e
        if result is not None and not ev.out:
            for e in ev.start("message"):
                yield e
        for e in ev.close():
            yield e
        final = self._response(req, rid, created, "completed", ev.out, result, prompt_tokens)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        yield ev.event(kind, response=final)


class StreamEvents:
    """The typed events of one streamed response: numbered in order, with the output items so far
    (``out``) and the reasoning or message item still open (``cur``) with its text."""

    def __init__(self) -> None:
        self.seq = 0
        self.out: list[dict[str, object]] = []
        self.cur: dict[str, object] | None = None
        self.text_so_far = ""

    def event(self, kind: str, **fields: object) -> str:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _part_event(self, kind: str, **fields: object) -> str:
        assert self.cur is not None
        i = len(self.out) - 1
        return self.event(kind, item_id=self.cur["id"], output_index=i, content_index=0, **fields)

    def close(self) -> list[str]:
        """Finish the open item, if any: its text's done events, then the item's."""
        cur, text = self.cur, self.text_so_far
        if cur is None:
            return []
        if cur["type"] == "reasoning":
            cur["content"] = [{"type": "reasoning_text", "text": text}]
            evs = [self._part_event("response.reasoning_text.done", text=text)]
        else:
            part = output_text(text)
            cur.update(status="completed", content=[part])
            evs = [
                self._part_event("response.output_text.done", text=text, logprobs=[]),
                self._part_event("response.content_part.done", part=part),
            ]
        evs.append(
            self.event("response.output_item.done", output_index=len(self.out) - 1, item=cur)
        )
        self.cur, self.text_so_far = None, ""
        return evs

    def start(self, kind: str) -> list[str]:
        """Close the open item and open a ``reasoning`` or ``message`` one."""
        evs = self.close()
        self.cur = new_item(kind)
        self.out.append(self.cur)
        i = len(self.out) - 1
        evs.append(self.event("response.output_item.added", output_index=i, item=dict(self.cur)))
        if kind == "message":
            evs.append(self._part_event("response.content_part.added", part=output_text("")))
        return evs

    def text(self, delta_kind: str, text: str) -> list[str]:
        """A reasoning or content delta, in the item of its kind (opened when it is not)."""
        kind = "reasoning" if delta_kind == "reasoning" else "message"
        evs = self.start(kind) if self.cur is None or self.cur["type"] != kind else []
        self.text_so_far += text
        if kind == "reasoning":
            evs.append(self._part_event("response.reasoning_text.delta", delta=text))
        else:
            evs.append(self._part_event("response.output_text.delta", delta=text, logprobs=[]))
        return evs

    def call(self, call: ToolCall) -> list[str]:
        """A decoded tool call as a ``function_call`` item: added, its arguments, done."""
        evs = self.close()
        done = function_item(call)
        self.out.append(done)
        i = len(self.out) - 1
        added = {**done, "status": "in_progress", "arguments": ""}
        args = done["arguments"]
        return evs + [
            self.event("response.output_item.added", output_index=i, item=added),
            self.event(
                "response.function_call_arguments.delta",
                item_id=done["id"],
                output_index=i,
                delta=args,
            ),
            self.event(
                "response.function_call_arguments.done",
                item_id=done["id"],
                output_index=i,
                arguments=args,
                name=done["name"],
            ),
            self.event("response.output_item.done", output_index=i, item=done),
        ]
