"""The turn planner: a validated request of any protocol as one ``TurnSpec``, planned into the
``Plan`` that every choice runs — the prompt, the budgets, and the output's layout, built once.

Each output kind has one layout strategy: text (no canvas; while tools are offered and no call
canvas fits, the ``<tool_call>`` tag is banned so text never holds call markup), ``json_object`` and
``json_schema`` (a schema canvas fitted into the room left), and tool calls (the call canvas
restricted to the offered tools, or to the named one). A layout's canvas is built here and carried
by the plan, so nothing builds it again per choice or per phase. Errors name the request's own
fields (``FieldNames``): a Responses request hears about ``text.format`` and ``max_output_tokens``,
a chat request about ``response_format`` and ``max_tokens``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ...sampling import SamplerConfig
from ...sampling.structured.canvas import StructuredCanvas, build_canvas
from ...sampling.structured.constrained import (
    Budgets,
    Piece,
    SchemaError,
    Slot,
    compile_cached,
    schema_pieces,
)
from ..config import ServerConfig
from ..metrics import Metrics
from ..protocol.chat import Tool
from ..protocol.errors import APIError, bad_request
from ..reliability.limits import check_schema, check_states
from .budgets import Split, check_explicit, check_prompt, split
from .generation import CallPlan, Effort, Plan, ServedModel
from .tools import CLOSE_TAG, OPEN_TAG, forced_call_pieces, tool_dicts

log = logging.getLogger("quicksilver.server")
Layout = tuple[list[Piece], StructuredCanvas]


@dataclass(frozen=True)
class FieldNames:
    """What the request calls the fields a planning error points at."""

    messages: str = "messages"
    tool_choice: str = "tool_choice"
    tool_parameters: str = "tools[{i}].function.parameters"
    max_tokens: str = "max_tokens"
    format: str = "response_format"
    schema: str = "response_format.json_schema.schema"


CHAT_FIELDS = FieldNames()
RESPONSES_FIELDS = FieldNames(
    messages="input",
    tool_parameters="tools[{i}].parameters",
    max_tokens="max_output_tokens",
    format="text.format",
    schema="text.format.schema",
)

MESSAGES_FIELDS = FieldNames(
    tool_parameters="tools[{i}].input_schema", format="tool_choice", schema="tools"
)


@dataclass
class TurnSpec:
    """One turn as the planner takes it, whatever protocol asked for it."""

    messages: list[dict[str, Any]]  # chat-template form (tools.template_messages)
    sampler: SamplerConfig  # the request's decoding settings
    effort: Effort
    max_tokens: int | None = None  # the client's own bound on the answer
    lower_max_tokens: bool = False  # above the cap or the room left, lower it (else a 400)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "none"  # none | auto | required | the name of the one tool to call
    parallel_tool_calls: bool = True
    output: str = "text"  # text | json_object | json_schema
    schema: Any = None  # json_schema: the schema (None: any JSON value)
    strict: bool = False
    stops: list[str] = field(default_factory=list)
    diffusing: bool = False
    logprobs: int | None = None  # record the answer's log-probabilities with this many alternatives
    fields: FieldNames = CHAT_FIELDS


class TurnPlanner:
    def __init__(self, served: ServedModel, config: ServerConfig, metrics: Metrics) -> None:
        self.served, self.cfg, self.metrics = served, config, metrics

    def plan(self, spec: TurnSpec) -> Plan:
        """The spec as a plan: prompt, budgets, structured layout or call canvas (400s name
        ``spec.fields``)."""
        c, f, tok = self.cfg, spec.fields, self.served.tokenizer
        mode = self._tool_mode(spec)
        structured = spec.output != "text"
        if structured and mode == "forced":
            raise bad_request(
                f"{f.format} and a forced {f.tool_choice} cannot be combined", f.format
            )
        # the answer phase's prompt is at least as long as the prompt that answers at once
        plain = self.prompt(spec, False)
        check_prompt(plain, c.max_prompt_tokens, self.served.max_context, f.messages)
        room = self.served.max_context - len(plain)
        mt = spec.max_tokens
        if mt is not None and spec.lower_max_tokens:
            mt = spec.max_tokens = max(1, min(mt, c.max_tokens, room))
        check_explicit(mt, room, c.max_tokens, self.served.max_context, len(plain), f.max_tokens)
        limit = min(mt or room, room)
        layout, calls = None, None
        if mode != "none" and not structured:
            calls = self._call_layout(spec, mode == "forced", limit, room)
        elif structured:
            layout = self._schema_layout(spec, limit)
        sizes = self._split(spec, room, layout, calls)
        if mode == "auto" and calls is None:
            self._calls_unavailable(room)
        # offered tools without a call canvas: the reply is text, and text never holds call markup
        ban = tok.token_to_id(OPEN_TAG) if spec.tools and calls is None else None
        return Plan(
            self.prompt(spec, True) if sizes.reasoning else plain,
            spec.sampler,
            sizes.answer,
            sizes.reasoning,
            canvas=layout[1] if layout is not None else None,
            ban_ids=[ban] if ban is not None else [],
            stop=spec.stops,
            diffusing=spec.diffusing,
            calls=calls,
            logprobs=spec.logprobs,
        )

    def _split(
        self, spec: TurnSpec, room: int, layout: Layout | None, calls: CallPlan | None
    ) -> Split:
        """Answer and reasoning budgets: a structured canvas fixes the answer's size, a forced
        call's canvas is the answer, an optional one is kept in reserve after it."""
        c, fixed, reserved = self.cfg, spec.max_tokens, 0
        if layout is not None:
            fixed = layout[1].length
        elif calls is not None:
            call_len = calls.canvas.length
            fixed = call_len if calls.forced else fixed
            reserved = 0 if calls.forced else min(call_len, room - 1)
            if fixed is not None and not calls.forced:
                fixed = max(1, min(fixed, room - reserved))
        want = min(spec.effort.reasoning, c.max_reasoning_tokens)
        return split(room, fixed, want, min(c.default_max_tokens, c.max_tokens), reserved)

    def prompt(self, spec: TurnSpec, reasoning: bool) -> list[int]:
        """The prompt's ids through the chat template: with the offered tools unless the turn
        calls none, opening a reasoning phase or answering at once."""
        tools = tool_dicts(spec.tools) if self._tool_mode(spec) != "none" else None
        kw: dict[str, Any] = {} if reasoning else {"reasoning": False}
        try:
            text = self.served.tokenizer.apply_chat_template(
                spec.messages, tools=tools, add_generation_prompt=True, **kw
            )
        except ConfigError as e:
            raise bad_request(str(e), spec.fields.messages) from None
        return self.served.tokenizer.encode(text)

    # ---- checks -----------------------------------------------------------------------------------
    def _tool_mode(self, spec: TurnSpec) -> str:
        """none | auto | forced (``required`` or a named tool)."""
        if spec.tool_choice not in ("none", "auto") and not spec.tools:
            raise bad_request(f"{spec.fields.tool_choice} needs tools", spec.fields.tool_choice)
        if spec.tool_choice == "none" or not spec.tools:
            return "none"
        return "auto" if spec.tool_choice == "auto" else "forced"

    def _calls_unavailable(self, room: int) -> None:
        """Under ``auto``, no call fits the room left beside the prompt: the turn answers in text
        (docs/SERVER.md, "Tools"); counted and logged, never silent."""
        self.metrics.inc("tool_calls_unavailable_total")
        log.warning(
            "tool_choice auto: no tool call fits the %d tokens left beside the prompt; "
            "the turn answers in text",
            room,
        )

    # ---- layout strategies ------------------------------------------------------------------------
    def _schema_layout(self, spec: TurnSpec, limit: int) -> Layout:
        """``json_object``: any object, its free-form budget the answer's; ``json_schema``: the
        schema's canvas (validated and costed first)."""
        c, f, tok, mt = self.cfg, spec.fields, self.served.tokenizer, spec.max_tokens
        if spec.output == "json_object":
            budget = min(mt or c.default_max_tokens, limit)
            layout = self._fit(
                lambda b: compile_cached(
                    json.dumps(["json_object", b.__dict__, id(tok)]),
                    lambda: schema_pieces({"type": "object"}, False, tok.encode, b),
                ),
                limit,
                spec,
                self._budgets(max(2, budget - 1)),
            )
        else:
            if spec.schema is not None:
                check_schema(spec.schema, f.schema, limit, f.max_tokens)

            def pieces(b: Budgets) -> list[Piece]:
                key = json.dumps([spec.schema, spec.strict, b.__dict__, id(tok)], sort_keys=True)
                try:
                    return compile_cached(
                        key, lambda: schema_pieces(spec.schema, spec.strict, tok.encode, b)
                    )
                except SchemaError as e:
                    raise bad_request(str(e), f.schema) from None

            layout = self._fit(pieces, limit, spec)
        check_states([p.machine for p in layout[0] if isinstance(p, Slot)], f.format)
        return layout

    def _call_layout(self, spec: TurnSpec, forced: bool, limit: int, room: int) -> CallPlan | None:
        """The call canvas restricted to the offered tools (the named one for a named choice). With
        ``auto``, a call that cannot fit beside the prompt is not offered (the turn answers in text);
        a forced call that cannot fit is the client's error."""
        tok = self.served.tokenizer
        # a forced call's fit is _fit's to report; here only what no budget could hold
        if not self._tools_fit(spec, forced, self.served.max_context if forced else room - 1):
            return None
        open_id = tok.token_to_id(OPEN_TAG)
        if open_id is None:
            raise bad_request("this model has no <tool_call> token to call tools with", "tools")
        named = None if spec.tool_choice in ("auto", "required") else spec.tool_choice
        try:
            pieces, canvas = self._fit(
                lambda b: forced_call_pieces(spec.tools, named, tok, b),
                limit if forced else room - 1,
                spec,
            )
        except APIError:
            if forced:
                raise
            return None
        check_states([p.machine for p in pieces if isinstance(p, Slot)], "tools")
        parallel = spec.parallel_tool_calls and named is None
        return CallPlan(
            canvas,
            open_id,
            tok.token_to_id(CLOSE_TAG),
            forced,
            self.cfg.max_tool_calls if parallel else 1,
        )

    def _tools_fit(self, spec: TurnSpec, forced: bool, canvas: int) -> bool:
        """Cost bounds of the tools' schemas before anything is compiled (hostile ones are 400s);
        False when, under ``auto``, a call could not fit ``canvas``."""
        for i, t in enumerate(spec.tools):
            if t.function.parameters is None:
                continue
            try:
                where = spec.fields.tool_parameters.format(i=i)
                check_schema(t.function.parameters, where, canvas, spec.fields.max_tokens)
            except APIError as e:
                if forced or e.code != "context_length_exceeded":
                    raise
                return False
        return True

    # ---- fitting a canvas into the room -----------------------------------------------------------
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
        spec: TurnSpec,
        start: Budgets | None = None,
    ) -> Layout:
        """The layout and its canvas with the configured slot budgets, or — when that canvas does
        not fit in ``limit`` (max_tokens, or the context) — with budgets shrunk to fit (every value
        keeps at least 2 tokens). Only a schema whose skeleton alone does not fit is refused."""
        tok, pad = self.served.tokenizer, self.served.pad_id
        b = start or self._budgets()
        pieces = layout(b)
        canvas = build_canvas(pieces, tok, pad)
        for _ in range(4):
            if canvas.length <= limit:
                return pieces, canvas
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
            canvas = build_canvas(pieces, tok, pad)
        if canvas.length <= limit:
            return pieces, canvas
        param = spec.fields.max_tokens
        raise bad_request(
            f"the structured output needs a canvas of at least {canvas.length} tokens; only "
            f"{limit} are available ({param}={spec.max_tokens}, context {self.served.max_context})",
            param,
            "context_length_exceeded",
        )
