"""``POST /v1/chat/completions``: messages -> plan -> choices, as one JSON response or an SSE stream.

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
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from ..errors import ConfigError
from ..sampling.canvas import build_canvas
from ..sampling.constrained import Budgets, Piece, SchemaError, Slot, compile_cached, schema_pieces
from .budgets import check_explicit, split
from .errors import APIError, bad_request
from .generation import CallPlan, ChoiceResult, Delta, Plan
from .limits import check_schema, check_states, check_strings
from .logprobs import chat_logprobs
from .protocol_chat import ChatCompletionRequest, NamedToolChoice, Tool
from .serving_engine import GenerationServing, usage_chunk, usage_extras
from .sse import sse_chunk
from .tools import CLOSE_TAG, OPEN_TAG, forced_call_pieces, template_messages, tool_dicts

log = logging.getLogger("quicksilver.server")


class OpenAIServingChat(GenerationServing):
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
        start: Budgets | None = None,
    ) -> list[Piece]:
        """The layout with the configured slot budgets, or — when that canvas does not fit in
        ``limit`` (max_tokens, or the context) — with budgets shrunk to fit (every value keeps at
        least 2 tokens). Only a schema whose skeleton alone does not fit is refused."""
        tok = self.b.tokenizer
        b = start or self._budgets()
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

    def plan(self, req: ChatCompletionRequest) -> Plan:
        """The request as a plan: prompt, sampler settings, budgets, structured layout, tool calls."""
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
            req.top_logprobs,
        )
        choice = req.tool_choice or ("auto" if tools else "none")
        if isinstance(choice, NamedToolChoice) or choice == "required":
            if not tools:
                raise bad_request("tool_choice needs tools", "tool_choice")
        mode = (
            "none" if choice == "none" or not tools else ("auto" if choice == "auto" else "forced")
        )
        fmt = req.response_format
        structured = fmt is not None and fmt.type != "text"
        if structured and mode == "forced":
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

        # the answer phase's prompt is at least as long as the prompt that answers at once
        plain = encode(False)
        self.check_prompt(plain)
        room = self.b.max_context - len(plain)
        check_explicit(max_tokens, room, c.max_tokens, self.b.max_context, len(plain), param)
        limit = min(max_tokens or room, room)
        pieces, calls = None, None
        if mode != "none" and not structured:
            forced = mode == "forced"
            # a forced call's fit is _fit's to report; here only what no budget could hold
            canvas = self.b.max_context if forced else room - 1
            if self._tools_fit(tools, forced, canvas, param):
                calls = self._calls(req, tools, choice, forced, limit, room, param, max_tokens)
        elif fmt is not None and fmt.type == "json_object":
            budget = min(max_tokens or c.default_max_tokens, limit)
            pieces = self._fit(
                lambda b: compile_cached(
                    json.dumps(["json_object", b.__dict__, id(tok)]),
                    lambda: schema_pieces({"type": "object"}, False, tok.encode, b),
                ),
                limit,
                param,
                max_tokens,
                self._budgets(max(2, budget - 1)),
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
        fixed = max_tokens
        reserved = 0
        if pieces is not None:
            check_states([p.machine for p in pieces if isinstance(p, Slot)], "response_format")
            fixed = self._length(pieces)
        elif calls is not None:
            check_states([p.machine for p in calls.pieces if isinstance(p, Slot)], "tools")
            call_len = self._length(calls.pieces)
            fixed = call_len if calls.forced else fixed
            reserved = 0 if calls.forced else min(call_len, room - 1)
            if fixed is not None and not calls.forced:
                fixed = max(1, min(fixed, room - reserved))
        want = min(effort.reasoning, c.max_reasoning_tokens)
        sizes = split(room, fixed, want, min(c.default_max_tokens, c.max_tokens), reserved)
        ids = encode(True) if sizes.reasoning else plain
        sampler = self.sampler(
            req, effort, req.temperature, req.top_p, req.seed, req.reasoning_effort is not None
        )
        if mode == "auto" and calls is None:
            self._calls_unavailable(room)
        # offered tools without a call canvas: the reply is text, and text never holds call markup
        ban = tok.token_to_id(OPEN_TAG) if tools and calls is None else None
        return Plan(
            ids,
            sampler,
            sizes.answer,
            sizes.reasoning,
            pieces=pieces,
            ban_ids=[ban] if ban is not None else [],
            stop=stops,
            diffusing=bool(req.diffusing),
            calls=calls,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        )

    def _calls_unavailable(self, room: int) -> None:
        """Under ``auto``, no call fits the room left beside the prompt: the turn answers in text
        (docs/SERVER.md, "Tools"); counted and logged, never silent."""
        self.metrics.inc("tool_calls_unavailable_total")
        log.warning(
            "tool_choice auto: no tool call fits the %d tokens left beside the prompt; "
            "the turn answers in text",
            room,
        )

    @staticmethod
    def _tools_fit(tools: list[Tool], forced: bool, canvas: int, param: str) -> bool:
        """Cost bounds of the tools' schemas before anything is compiled (hostile ones are 400s).
        Under ``auto`` a call too long for the room left is not offered (the turn answers in text);
        a forced call that cannot fit is the client's error."""
        for i, t in enumerate(tools):
            if t.function.parameters is None:
                continue
            try:
                check_schema(
                    t.function.parameters, f"tools[{i}].function.parameters", canvas, param
                )
            except APIError as e:
                if forced or e.code != "context_length_exceeded":
                    raise
                return False
        return True

    def _length(self, pieces: list[Piece]) -> int:
        return build_canvas(pieces, self.b.tokenizer, self.b.pad_id).length

    def _calls(
        self,
        req: ChatCompletionRequest,
        tools: list[Tool],
        choice: Any,
        forced: bool,
        limit: int,
        room: int,
        param: str,
        max_tokens: int | None,
    ) -> CallPlan | None:
        """The call canvas restricted to the offered tools (the named one for a named choice). With
        ``auto``, a call that cannot fit beside the prompt is not offered (the turn answers in text)."""
        tok = self.b.tokenizer
        open_id = tok.token_to_id(OPEN_TAG)
        if open_id is None:
            raise bad_request("this model has no <tool_call> token to call tools with", "tools")
        named = choice.function.name if isinstance(choice, NamedToolChoice) else None
        try:
            pieces = self._fit(
                lambda b: forced_call_pieces(tools, named, tok, b),
                limit if forced else room - 1,
                param,
                max_tokens,
            )
        except APIError:
            if forced:
                raise
            return None
        parallel = req.parallel_tool_calls is not False and named is None
        return CallPlan(
            pieces,
            open_id,
            tok.token_to_id(CLOSE_TAG),
            forced,
            self.cfg.max_tool_calls if parallel else 1,
        )

    # ---- responses -------------------------------------------------------------------------
    def chat_logprobs(self, r: ChoiceResult) -> dict[str, Any] | None:
        return None if r.logprobs is None else chat_logprobs(self.b.tokenizer, r.logprobs)

    @staticmethod
    def message(r: ChoiceResult) -> dict[str, Any]:
        """The assistant message of a finished choice (content is ``None`` beside tool calls when
        the turn wrote no text before them)."""
        msg: dict[str, Any] = {"role": "assistant", "content": r.text}
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
            "model": self.b.name,
            "choices": choices,
            **usage_extras(len(plan.prompt_ids), results),
        }

    def stream(self, req: ChatCompletionRequest, arrival: float) -> AsyncGenerator[str, None]:
        plan = self.plan(req)  # errors here are plain HTTP errors, before the stream starts
        runners = self.runners([plan], req.n or 1, req.seed, arrival)
        return self._stream(req, plan, runners)

    async def _stream(
        self, req: ChatCompletionRequest, plan: Plan, runners: list[Any]
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
                cid, "chat.completion.chunk", created, self.b.name, len(plan.prompt_ids), results
            )
        yield "data: [DONE]\n\n"


def call_deltas(index: int, call: dict[str, Any]) -> list[dict[str, Any]]:
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
