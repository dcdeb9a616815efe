"""``POST /v1/chat/completions``: messages -> plan -> choices, as one JSON response or an SSE stream.

Stream format (OpenAI's): every chunk has the same ``id``; the first delta of each choice carries
``role``; then append-only ``content`` (and ``reasoning_content``/``reasoning``) deltas of final
text; tool calls arrive parsed, in one ``tool_calls`` delta; a last chunk per choice has the
``finish_reason``; with ``stream_options.include_usage`` a chunk with empty ``choices`` and the
``usage`` follows; then ``data: [DONE]``. With ``diffusing`` every step also sends a chunk whose
choice has an empty delta and a ``canvas`` object (see docs/SERVER.md).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ..errors import ConfigError
from ..sampling.constrained import (
    Budgets,
    Piece,
    SchemaError,
    Slot,
    build_canvas,
    compile_cached,
    schema_pieces,
)
from .errors import bad_request
from .generation import ChoiceResult, Delta, Plan
from .limits import check_schema, check_states, check_strings
from .protocol import usage
from .protocol_chat import ChatCompletionRequest, NamedToolChoice
from .serving_engine import OpenAIServing, sse, sse_chunk
from .tools import (
    ToolStreamFilter,
    forced_call_pieces,
    parse_tool_calls,
    template_messages,
    tool_dicts,
)


class OpenAIServingChat(OpenAIServing):
    def _budgets(self, answer: int | None = None) -> Budgets:
        c = self.cfg
        return Budgets(
            string=c.json_string_tokens,
            number=c.json_number_tokens,
            integer=max(2, c.json_number_tokens - 2),
            free_object=answer if answer is not None else c.json_object_tokens,
        )

    def _fit(
        self,
        layout: Callable[[Budgets], list[Piece]],
        limit: int,
        param: str,
        max_tokens: int | None,
    ) -> list[Piece]:
        """The layout with the configured slot budgets, or — when that canvas does not fit in
        ``limit`` (max_tokens, or the context) — with budgets shrunk to fit (every value keeps at
        least 2 tokens). Only a schema whose skeleton alone does not fit is refused."""
        tok = self.b.tokenizer
        b = self._budgets()
        pieces = layout(b)
        for _ in range(4):
            canvas = build_canvas(pieces, tok, self.b.pad_id)
            if canvas.length <= limit:
                return pieces
            slots = canvas.length - len(canvas.prefill)
            f = max(0.0, (limit - len(canvas.prefill)) / max(slots, 1)) * 0.95
            b = Budgets(
                string=max(2, int(b.string * f)),
                number=max(2, int(b.number * f)),
                integer=max(2, int(b.integer * f)),
                free_object=max(4, int(b.free_object * f)),
                array_items=max(1, int(b.array_items * min(1.0, f))),
            )
            pieces = layout(b)
        length = build_canvas(pieces, tok, self.b.pad_id).length
        if length <= limit:
            return pieces
        raise bad_request(
            f"the structured output needs a canvas of at least {length} tokens; only {limit} are "
            f"available ({param}={max_tokens}, context {self.b.max_context})",
            param,
            "context_length_exceeded",
        )

    def plan(self, req: ChatCompletionRequest) -> tuple[Plan, str]:
        """The request as a plan, and its tool mode: none | parse | forced."""
        c = self.cfg
        self.check_model(req.model)
        check_strings(req.model_dump(exclude_none=True, by_alias=True))
        if len(req.messages) > c.max_messages:
            raise bad_request(
                f"at most {c.max_messages} messages are accepted, got {len(req.messages)}",
                "messages",
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
            req.logprobs or req.top_logprobs,
        )
        choice = req.tool_choice or ("auto" if tools else "none")
        if isinstance(choice, NamedToolChoice) or choice == "required":
            if not tools:
                raise bad_request("tool_choice needs tools", "tool_choice")
        mode = (
            "none" if choice == "none" or not tools else ("parse" if choice == "auto" else "forced")
        )
        fmt = req.response_format
        if fmt is not None and fmt.type != "text" and mode == "forced":
            raise bad_request(
                "response_format and a forced tool_choice cannot be combined", "response_format"
            )
        effort = self.effort(req.reasoning_effort, req, self.b.think_ids is not None)
        tok = self.b.tokenizer
        messages = template_messages(req.messages)
        template_tools = tool_dicts(tools) if mode != "none" else None
        max_tokens = req.max_completion_tokens or req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"

        def encode(reasoning: bool) -> list[int]:
            kw: dict[str, Any] = {} if reasoning else {"reasoning": False}
            try:
                text = tok.apply_chat_template(
                    messages, tools=template_tools, add_generation_prompt=True, **kw
                )
            except ConfigError as e:
                raise bad_request(str(e), "messages") from None
            return tok.encode(text)

        ids = encode(effort.reasoning > 0)
        self.check_prompt(ids)
        pieces = None
        limit = min(max_tokens or self.b.max_context, self.b.max_context - len(ids))
        if mode == "forced":
            name = choice.function.name if isinstance(choice, NamedToolChoice) else None
            for i, t in enumerate(tools):
                if t.function.parameters is not None:
                    check_schema(
                        t.function.parameters, f"tools[{i}].function.parameters", limit, param
                    )
            pieces = self._fit(
                lambda b: forced_call_pieces(tools, name, tok, b), limit, param, max_tokens
            )
        elif fmt is not None and fmt.type == "json_object":
            budget = min(max_tokens or c.default_max_tokens, limit)
            pieces = compile_cached(
                f"json_object:{budget}:{id(tok)}",
                lambda: schema_pieces(
                    {"type": "object"}, False, tok.encode, self._budgets(budget - 1)
                ),
            )
        elif fmt is not None and fmt.type == "json_schema":
            js = fmt.json_schema
            assert js is not None
            strict = bool(js.strict)
            if js.schema_ is not None:
                check_schema(js.schema_, "response_format.json_schema.schema", limit, param)

            def layout(b: Budgets) -> list[Piece]:
                key = json.dumps([js.schema_, strict, b.__dict__, id(tok)], sort_keys=True)
                try:
                    return compile_cached(
                        key, lambda: schema_pieces(js.schema_, strict, tok.encode, b)
                    )
                except SchemaError as e:
                    raise bad_request(str(e), "response_format.json_schema.schema") from None

            pieces = self._fit(layout, limit, param, max_tokens)
        if pieces is not None:
            machines = [p.machine for p in pieces if isinstance(p, Slot)]
            check_states(machines, "tools" if mode == "forced" else "response_format")
            max_tokens = build_canvas(pieces, tok, self.b.pad_id).length
        answer, think = self.budgets(len(ids), max_tokens, effort.reasoning, param)
        if effort.reasoning > 0 and think == 0:  # no room to think: answer at once
            ids = encode(False)
        sampler = self.sampler(
            req, effort, req.temperature, req.top_p, req.seed, req.reasoning_effort is not None
        )
        ban = []
        if mode == "none" and tok.token_to_id("<tool_call>") is not None and tools:
            ban = [tok.token_to_id("<tool_call>")]
        plan = Plan(
            ids,
            sampler,
            answer,
            think,
            pieces=pieces,
            ban_ids=[b for b in ban if b is not None],
            stop=stops,
            diffusing=bool(req.diffusing),
        )
        return plan, mode

    # ---- responses -------------------------------------------------------------------------
    def _message(
        self, r: ChoiceResult, mode: str, parallel: bool = True
    ) -> tuple[dict[str, Any], str]:
        msg: dict[str, Any] = {"role": "assistant", "content": r.text}
        finish = r.finish_reason
        if mode != "none":
            content, calls = parse_tool_calls(r.text)
            calls = calls if parallel else calls[:1]
            if calls:
                msg["content"], msg["tool_calls"] = content, calls
                finish = "tool_calls" if finish in ("stop", "length") else finish
        if r.reasoning is not None:
            msg["reasoning_content"] = msg["reasoning"] = r.reasoning
        return msg, finish

    async def create(self, req: ChatCompletionRequest, arrival: float) -> dict[str, Any]:
        plan, mode = await asyncio.to_thread(self.plan, req)  # off the event loop
        runners = self.runners([plan], req.n or 1, req.seed, arrival)
        results = await self.collect(runners)
        choices, totals = [], [0, 0, 0, 0, 0]
        for r in results:
            msg, finish = self._message(r, mode, req.parallel_tool_calls is not False)
            choices.append(
                {"index": r.index, "message": msg, "logprobs": None, "finish_reason": finish}
            )
            totals = [
                a + b
                for a, b in zip(
                    totals, (r.completion_tokens, r.reasoning_tokens, r.nfe, r.steps, 0)
                )
            ]
        gen, reasoning, nfe, steps, _ = totals
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.b.name,
            "choices": choices,
            "usage": usage(len(plan.prompt_ids), gen, reasoning, results[0].cached_tokens),
            "diffusion": {"nfe": nfe, "steps": steps, "tpf": round(gen / nfe, 3) if nfe else 0.0},
        }

    def stream(self, req: ChatCompletionRequest, arrival: float) -> AsyncGenerator[str, None]:
        plan, mode = self.plan(req)  # errors here are plain HTTP errors, before the stream starts
        runners = self.runners([plan], req.n or 1, req.seed, arrival)
        return self._stream(req, plan, mode, runners)

    async def _stream(
        self, req: ChatCompletionRequest, plan: Plan, mode: str, runners: list[Any]
    ) -> AsyncGenerator[str, None]:
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(
            index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any
        ) -> str:
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
                **extra,
            }
            return sse_chunk(
                cid, "chat.completion.chunk", created, self.b.name, choice, include_usage
            )

        filters = {r.result.index: ToolStreamFilter() for r in runners}
        gen = reasoning = cached = 0
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
                    text = filters[i].push(item.text) if mode != "none" else item.text
                    if text:
                        yield chunk(i, {"content": text})
                else:
                    yield chunk(i, {}, canvas=item.canvas)
                continue
            finish = item.finish_reason
            if mode != "none":
                text, calls = filters[i].finish()
                calls = calls if req.parallel_tool_calls is not False else calls[:1]
                if text:
                    yield chunk(i, {"content": text})
                if calls:
                    yield chunk(i, {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]})
                    finish = "tool_calls" if finish in ("stop", "length") else finish
            gen += item.completion_tokens
            reasoning += item.reasoning_tokens
            cached = cached or item.cached_tokens
            yield chunk(i, {}, finish)
        if include_usage:
            yield sse(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": self.b.name,
                    "choices": [],
                    "usage": usage(len(plan.prompt_ids), gen, reasoning, cached),
                }
            )
        yield "data: [DONE]\n\n"
