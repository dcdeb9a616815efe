"""``POST /v1/chat/completions``: the request -> a ``TurnSpec`` -> the planner's plan -> choices, as
one JSON response or an SSE stream.

Stream format (OpenAI's): every chunk has the same ``id``; the first delta of each choice carries
``role``; then append-only ``content`` (and ``reasoning_content``/``reasoning``) deltas of final
text; each tool call, once decoded, as two ``tool_calls`` deltas (head, then arguments) with its
``index``; a last chunk per choice has the
``finish_reason``; with ``stream_options.include_usage`` a chunk with empty ``choices`` and the
``usage`` follows; then ``data: [DONE]``. With ``diffusing`` every step also sends a chunk whose
choice has an empty delta and a ``canvas`` object (see docs/SERVER.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from ..config import ServerConfig
from ..metrics import Metrics
from ..protocol.chat import ChatCompletionRequest, NamedToolChoice
from ..protocol.errors import bad_request
from ..protocol.sse import sse_chunk
from ..reliability.limits import check_strings
from .engine import GenerationServing, usage_chunk, usage_extras
from .generation import ChoiceResult, ChoiceRunner, Delta, Plan, ServedModel
from .logprobs import chat_logprobs
from .planner import CHAT_FIELDS, FieldNames, TurnPlanner, TurnSpec
from .tools import ToolCall, template_messages


class OpenAIServingChat(GenerationServing):
    def __init__(self, served: ServedModel, config: ServerConfig, metrics: Metrics) -> None:
        super().__init__(served, config, metrics)
        self.planner = TurnPlanner(served, config, metrics)

    def spec(self, req: ChatCompletionRequest, fields: FieldNames = CHAT_FIELDS) -> TurnSpec:
        """The request validated as a ``TurnSpec`` (limits, model, sampler settings)."""
        c = self.cfg
        self.check_model(req.model)
        check_strings(req.model_dump(exclude_none=True, by_alias=True))
        if len(req.messages) > c.max_messages:
            raise bad_request(
                f"at most {c.max_messages} messages are accepted, got {len(req.messages)}",
                fields.messages,
            )
        tools = req.tools or []
        if len(tools) > c.max_tools:
            raise bad_request(
                f"at most {c.max_tools} tools are accepted, got {len(tools)}", "tools"
            )
        stops = self.check_common(
            req.n,
            req.stop,
            req.logit_bias,
            (req.frequency_penalty, req.presence_penalty),
            req.top_logprobs,
        )
        choice = req.tool_choice or ("auto" if tools else "none")
        effort = self.effort(req.reasoning_effort, req, self.served.think_ids is not None)
        fmt = req.response_format
        js = fmt.json_schema if fmt is not None and fmt.type == "json_schema" else None
        if req.max_completion_tokens and fields is CHAT_FIELDS:
            fields = replace(fields, max_tokens="max_completion_tokens")
        return TurnSpec(
            messages=template_messages(req.messages),
            sampler=self.sampler(
                req, effort, req.temperature, req.top_p, req.seed, req.reasoning_effort is not None
            ),
            effort=effort,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            tools=tools,
            tool_choice=choice.function.name if isinstance(choice, NamedToolChoice) else choice,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            output=fmt.type if fmt is not None else "text",
            schema=js.schema_ if js is not None else None,
            strict=bool(js.strict) if js is not None else False,
            stops=stops,
            diffusing=bool(req.diffusing),
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
            fields=fields,
        )

    def plan(self, req: ChatCompletionRequest, fields: FieldNames = CHAT_FIELDS) -> Plan:
        """The request as the plan its choices run (``planner.TurnPlanner``)."""
        return self.planner.plan(self.spec(req, fields))

    # ---- responses -------------------------------------------------------------------------
    def chat_logprobs(self, r: ChoiceResult) -> dict[str, object] | None:
        return None if r.logprobs is None else chat_logprobs(self.served.tokenizer, r.logprobs)

    @staticmethod
    def message(r: ChoiceResult) -> dict[str, object]:
        """The assistant message of a finished choice (content is ``None`` beside tool calls when
        the turn wrote no text before them)."""
        msg: dict[str, object] = {"role": "assistant", "content": r.text}
        if r.tool_calls:
            msg["content"] = r.text.strip() or None
            msg["tool_calls"] = r.tool_calls
        if r.reasoning is not None:
            msg["reasoning_content"] = msg["reasoning"] = r.reasoning
        return msg

    async def create(self, req: ChatCompletionRequest, arrival: float) -> dict[str, Any]:
        plan = await asyncio.to_thread(self.plan, req)  # off the event loop
        results = await self.collect(self.runners([plan], req.n or 1, req.seed, arrival))
        choices = [
            {
                "index": r.index,
                "message": self.message(r),
                "logprobs": self.chat_logprobs(r),
                "finish_reason": r.finish_reason,
            }
            for r in results
        ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.served.name,
            "choices": choices,
            **usage_extras(len(plan.prompt_ids), results),
        }

    def stream(self, req: ChatCompletionRequest, arrival: float) -> AsyncGenerator[str, None]:
        plan = self.plan(req)  # errors here are plain HTTP errors, before the stream starts
        runners = self.runners([plan], req.n or 1, req.seed, arrival)
        return self._stream(req, plan, runners)

    async def _stream(
        self, req: ChatCompletionRequest, plan: Plan, runners: list[ChoiceRunner]
    ) -> AsyncGenerator[str, None]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(
            index: int, delta: dict[str, object], finish: str | None = None, **extra: object
        ) -> str:
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **extra,
            }
            return sse_chunk(
                cid, "chat.completion.chunk", created, self.served.name, choice, include_usage
            )

        calls = {r.result.index: 0 for r in runners}
        results = []
        started = False
        async for i, item in self.merged(runners):
            if isinstance(item, BaseException):
                raise item
            if not started:  # nothing is sent before the engine has taken every choice
                started = True
                for r in runners:
                    yield chunk(r.result.index, {"role": "assistant", "content": ""})
            if isinstance(item, Delta):
                if item.kind == "reasoning":
                    yield chunk(i, {"reasoning_content": item.text, "reasoning": item.text})
                elif item.kind == "content":
                    yield chunk(i, {"content": item.text})
                elif item.kind == "tool_call" and item.call is not None:
                    for delta in call_deltas(calls[i], item.call):
                        yield chunk(i, {"tool_calls": [delta]})
                    calls[i] += 1
                else:
                    yield chunk(i, {}, canvas=item.canvas)
                continue
            results.append(item)
            lp = self.chat_logprobs(item)
            yield chunk(i, {}, item.finish_reason, **({"logprobs": lp} if lp else {}))
        if include_usage:
            yield usage_chunk(
                cid,
                "chat.completion.chunk",
                created,
                self.served.name,
                len(plan.prompt_ids),
                results,
            )
        yield "data: [DONE]\n\n"


def chat_request(body: dict[str, object], param: str) -> ChatCompletionRequest:
    """Another protocol's request as the chat completion it is planned as, validated (a 400
    naming ``param``, the field of that protocol it came from)."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        raise bad_request(f"{loc}: {err.get('msg')}", param) from None


def call_deltas(index: int, call: ToolCall) -> list[dict[str, object]]:
    """A finished call as OpenAI streams one: a head (id, type, name, empty arguments), then the
    arguments (clients concatenate ``arguments`` per ``index``)."""
    fn = call["function"]
    return [
        {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": fn["name"], "arguments": ""},
        },
        {"index": index, "function": {"arguments": fn["arguments"]}},
    ]
