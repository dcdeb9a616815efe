"""From a parsed request to text: the served model, the per-choice plan, and the phases that run it.

A choice runs in up to two engine requests (phases):

1. **Reasoning** (when the effort asks for it): the prompt ends with the assistant header, the
   canvas has ``<think>`` prefilled at position 0 and its own budget (``reasoning_budget``). The
   phase ends when ``</think>`` is committed with everything before it (a stop token of the phase), when the model
   stops, or when the budget runs out.
2. **Answer**: the prompt plus ``<think>reasoning</think>``, with the full ``max_tokens`` (or a
   structured canvas: skeleton + slots). Reasoning never eats the answer's budget: an empty
   answer can only come from the model choosing to stop.

With tools (``tool_choice`` auto, required or named) the answer may end in **calls**, each decoded
on its own canvas (``CallPlan``): with ``auto`` the answer phase ends as soon as ``<tool_call>`` is
committed with everything before it (a stop token of the phase; the text before it is the
content), then the call is decoded on the schema canvas restricted to the offered tools
(``<tool_call>{"name": <an offered name>, "arguments": <that tool's parameters>}</tool_call>``,
the skeleton prefilled, values grammar-checked), exactly as a forced call is. With
``parallel_tool_calls`` a one-position canvas that may hold only ``<tool_call>`` or a stop token
decides whether another call follows, up to ``CallPlan.max_calls``. So content never holds call
markup and every call names an offered tool and validates.

Each phase streams ``Delta``s: append-only text that is final (a token is final once everything
before it is committed and it can no longer change), each finished call, and — with
``diffusing`` — the canvas state after every step. Stop strings cut the answer and cancel its
request at once.
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Literal

from ...engine import EngineEvent, EngineRequest, IncrementalDetokenizer
from ...sampling import SamplerConfig
from ...sampling.core.hooks import Constraint
from ...sampling.structured.canvas import AllowTokens, BanTokens, StructuredCanvas
from ...tokenizer import Tokenizer
from ..async_engine import EngineClient
from ..metrics import Metrics
from ..protocol.errors import APIError
from .logprobs import LogprobRecorder, TokenLogprob
from .tools import OPEN_TAG, ToolCall, parse_tool_calls

MASK_GLYPH = "░"


@dataclass
class ServedModel:
    """The served model as the server sees it: a name, a tokenizer, an engine, a few facts."""

    name: str
    tokenizer: Tokenizer
    engine: EngineClient
    max_context: int
    attention: str  # bidirectional | block_causal | causal
    stop_ids: list[int]
    mask_id: int
    # the family's / checkpoint's sampler settings
    defaults: dict[str, Any] = field(default_factory=dict)
    runtime: str = "torch"  # what runs its single-sequence passes (Pipeline.runtime_name)
    # the apply and next-edit routes go to this model when a request names no served model
    edits: bool = False

    def tid(self, text: str) -> int | None:
        return self.tokenizer.token_to_id(text)

    @property
    def think_ids(self) -> tuple[int, int] | None:
        a, b = self.tid("<think>"), self.tid("</think>")
        return (a, b) if a is not None and b is not None else None

    @property
    def pad_id(self) -> int:
        """The filler of unused structured-output slot positions: a pad token the detokenizer hides,
        else a space (JSON allows whitespace between tokens)."""
        pad = self.tokenizer.pad_id
        if pad is not None and pad not in self.stop_ids and pad != self.mask_id:
            return pad
        return self.tokenizer.encode(" ")[0]


@dataclass
class Effort:
    reasoning: int  # reasoning phase budget in tokens (0: answer at once)
    threshold: float
    revise_threshold: float | None = None
    max_revisions: int = 0


# reasoning_effort -> a real decoding budget: whether to think first and for how long, how sure a
# position must be to commit (lower commits more per forward pass), and whether to revise.
EFFORTS: dict[str, Effort] = {
    "none": Effort(0, 0.9),
    "instant": Effort(0, 0.7),
    "minimal": Effort(0, 0.7),
    "low": Effort(96, 0.85),
    "medium": Effort(256, 0.9, 0.3, 1),
    "high": Effort(640, 0.95, 0.5, 2),
}
MIN_REASONING = 8  # a reasoning budget smaller than this is skipped


@dataclass
class CallPlan:
    """How a turn's tool calls are decoded: each call on ``canvas`` (restricted to the offered
    tools); ``forced`` (required / named) starts the turn with a call; at most ``max_calls``."""

    canvas: StructuredCanvas
    open_id: int  # <tool_call>: a stop token of the content phase
    close_id: int | None  # </tool_call>: banned from content
    forced: bool
    max_calls: int = 1


@dataclass
class Plan:
    """Everything one choice needs; built once per request (choices differ only in seed)."""

    prompt_ids: list[int]
    sampler: SamplerConfig  # everything but max_new_tokens
    answer_tokens: int  # canvas of the answer phase (structured: the layout's length)
    reasoning_budget: int = 0
    suffix_ids: list[int] | None = None
    canvas: StructuredCanvas | None = None  # the structured answer's layout, built once
    ban_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    diffusing: bool = False
    calls: CallPlan | None = None
    # record the answer's log-probabilities, with this many alternatives
    logprobs: int | None = None


@dataclass
class Delta:
    kind: Literal["reasoning", "content", "canvas", "tool_call"]
    text: str = ""
    canvas: dict[str, Any] | None = None
    call: ToolCall | None = None  # an OpenAI tool call (kind tool_call)


@dataclass
class ChoiceResult:
    index: int
    text: str = ""
    reasoning: str | None = None
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    nfe: int = 0
    steps: int = 0
    structured: bool = False
    cached_tokens: int = 0  # prompt tokens the prefix cache served (first phase)
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # the answer's tokens, when the request asked
    stop_string: str | None = None  # the client's stop string that ended the text, if one did


class EngineFailure(APIError):
    def __init__(self, message: str) -> None:
        super().__init__(500, f"generation failed: {message}", "server_error", None, "engine_error")


def render_canvas(tok: Tokenizer, canvas: list[int], mask_id: int, skip: int = 0) -> str:
    """The canvas as text: committed runs decoded, each masked position shown as ``MASK_GLYPH``."""
    out: list[str] = []
    run: list[int] = []
    for t in canvas[skip:]:
        if t == mask_id:
            if run:
                out.append(tok.decode(run))
                run = []
            out.append(MASK_GLYPH)
        else:
            run.append(t)
    if run:
        out.append(tok.decode(run))
    return "".join(out)


@functools.lru_cache(maxsize=1 << 16)
def token_text(tok: Tokenizer, token: int) -> str:
    """One token's own text, special tokens by name (cached: a canvas is redrawn every step)."""
    return tok.decode([token], skip_special_tokens=False)


def canvas_cells(
    tok: Tokenizer, canvas: list[int], mask_id: int, skip: int = 0
) -> list[str | None]:
    """The canvas position by position: each token's text, ``None`` where masked (for UIs that
    draw one cell per position)."""
    return [None if t == mask_id else token_text(tok, t) for t in canvas[skip:]]


class StopCutter:
    """Cuts text at the first stop string; holds back a tail that could still become one."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.text = ""  # everything seen
        self.sent = 0  # characters released
        self.hit: str | None = None  # the stop string that cut the text

    def push(self, delta: str) -> str:
        if self.hit:
            return ""
        self.text += delta
        found = [(i, s) for s in self.stops if (i := self.text.find(s)) >= 0]
        if found:
            cut, self.hit = min(found)
            out = self.text[self.sent : cut]
            self.text, self.sent = self.text[:cut], cut
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = max(self.sent, len(self.text) - hold)
        out, self.sent = self.text[self.sent : end], end
        return out

    def flush(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


class ChoiceRunner:
    """Runs one choice's phases against the engine and yields its deltas; fills ``result``."""

    def __init__(
        self,
        served: ServedModel,
        plan: Plan,
        index: int,
        metrics: Metrics,
        arrival: float,
        seed: int | None = None,
    ) -> None:
        self.served, self.plan, self.metrics, self.arrival = served, plan, metrics, arrival
        self.sampler = plan.sampler if seed is None else plan.sampler.replace(seed=seed)
        self.result = ChoiceResult(index, prompt_tokens=len(plan.prompt_ids))
        self.rid = f"{uuid.uuid4().hex[:16]}-{index}"
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.queue_time: float | None = None
        self._reasoning_ids: list[int] = []
        self._opened = False  # the answer phase ended by opening a tool call

    async def _phase(
        self,
        name: str,
        prompt: list[int],
        sampler: SamplerConfig,
        prefill: dict[int, int] | None = None,
        constraint: Constraint | None = None,
        suffix: list[int] | None = None,
        stop_ids: list[int] | None = None,
    ) -> AsyncGenerator[EngineEvent, None]:
        rid = f"{self.rid}-{name}"
        await self.served.engine.submit(
            EngineRequest(
                rid,
                prompt,
                sampler,
                prefill=prefill,
                suffix=suffix,
                constraint=constraint,
                stop_token_ids=stop_ids,
            )
        )
        async with contextlib.aclosing(self.served.engine.events(rid)) as events:
            async for ev in events:
                if self.queue_time is None:
                    self.queue_time = ev.stats.queue_time
                    self.result.cached_tokens = int(getattr(ev, "cached_tokens", 0))
                self.metrics.inc("diffusion_remasked_tokens_total", len(ev.remasked))
                if ev.finish_reason == "error":
                    raise EngineFailure(ev.error or "unknown error")
                yield ev

    def _tick(self, has_text: bool) -> None:
        if not has_text:
            return
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
            self.metrics.observe("time_to_first_token_seconds", now - self.arrival)
        elif self.last_token is not None:
            self.metrics.observe("inter_token_latency_seconds", now - self.last_token)
        self.last_token = now

    def _canvas(self, phase: str, ev: EngineEvent, skip: int = 0) -> Delta:
        canvas = ev.canvas or []
        return Delta(
            "canvas",
            canvas={
                "phase": phase,
                "step": ev.nfe,
                "text": render_canvas(self.served.tokenizer, canvas, self.served.mask_id, skip),
                "masked": sum(1 for t in canvas if t == self.served.mask_id),
                "committed": len(ev.committed),
                "remasked": len(ev.remasked),
                "stable": max(0, ev.stable - skip),
                "done": ev.done,
                "cells": canvas_cells(self.served.tokenizer, canvas, self.served.mask_id, skip),
                "fresh": [p - skip for p, _ in ev.committed if p >= skip],
                "revised": [p - skip for p in ev.remasked if p >= skip],
            },
        )

    async def run(self) -> AsyncGenerator[Delta, None]:
        plan, res = self.plan, self.result
        prompt = list(plan.prompt_ids)
        think = self.served.think_ids
        if plan.reasoning_budget and think is not None:
            async for d in self._reason(prompt, think):
                yield d
            prompt = prompt + [think[0]] + self._reasoning_ids + [think[1]]
        async for d in self._answer(prompt):
            yield d
        res.completion_tokens += res.reasoning_tokens
        self._finish_metrics()

    async def _reason(
        self, prompt: list[int], think: tuple[int, int]
    ) -> AsyncGenerator[Delta, None]:
        cfg = self.sampler.replace(
            max_new_tokens=self.plan.reasoning_budget,
            record_canvas=self.plan.diffusing,
            stop_at_eos=True,
        )
        detok = IncrementalDetokenizer(self.served.tokenizer)
        self._reasoning_ids = []
        pos, ended, last = 0, False, None
        # </think> is a stop token of this phase: once it is committed with everything before it, the
        # phase is over at once (honest length), not when its block has been checked
        async for ev in self._phase(
            "think", prompt, cfg, prefill={0: think[0]}, stop_ids=[think[1]]
        ):
            last = ev
            fresh: list[int] = []
            for t in ev.new_tokens:
                pos += 1
                if pos == 1:
                    continue  # the prefilled <think>
                if t == think[1]:
                    ended = True
                    break
                fresh.append(t)
            self._reasoning_ids += fresh
            text = detok.push(fresh) if fresh else ""
            self._tick(bool(text))
            if text:
                yield Delta("reasoning", text)
            if self.plan.diffusing:
                yield self._canvas("reasoning", ev, skip=1)
            if ended or ev.done:
                break  # leaving the phase cancels its request (the answer gets its own canvas)
        tail = detok.flush()
        if tail:
            yield Delta("reasoning", tail)
        self.result.reasoning = detok.text
        self.result.reasoning_tokens = len(self._reasoning_ids)
        self._account(last)

    async def _answer(self, prompt: list[int]) -> AsyncGenerator[Delta, None]:
        calls = self.plan.calls
        if calls is not None and calls.forced:
            opened = True
        else:
            content: list[int] = []
            async for d in self._content(prompt, content):
                yield d
            opened = self._opened
            prompt = prompt + content
        if calls is not None and opened:
            async for d in self._calls(prompt, calls):
                yield d

    async def _content(self, prompt: list[int], out: list[int]) -> AsyncGenerator[Delta, None]:
        """The answer phase (free text or a structured canvas); appends its tokens to ``out``. With
        ``auto`` tools it ends at a committed ``<tool_call>`` (``self._opened``), which is not text."""
        plan, res = self.plan, self.result
        calls = plan.calls
        prefill: dict[int, int] | None = None
        constraint: Constraint | None = None
        stop_ids: list[int] | None = None
        stops = [] if plan.canvas is not None else list(plan.stop)
        length = plan.answer_tokens
        if plan.canvas is not None:
            canvas = plan.canvas
            prefill, constraint, length = canvas.prefill, canvas.constraint, canvas.length
            res.structured = True
            self.metrics.inc("structured_requests_total")
        elif calls is not None:
            stop_ids, stops = [calls.open_id], stops + [OPEN_TAG]
            if calls.close_id is not None:
                constraint = BanTokens([calls.close_id])
        elif plan.ban_ids:
            constraint = BanTokens(plan.ban_ids)
        recorder = None
        if plan.logprobs is not None:
            constraint = recorder = LogprobRecorder(constraint, plan.logprobs)
        cfg = self.sampler.replace(max_new_tokens=length, record_canvas=plan.diffusing)
        detok = IncrementalDetokenizer(self.served.tokenizer)
        cutter = StopCutter(stops)
        # position -> token, to tell which stop token ended the phase
        committed: dict[int, int] = {}
        n_tokens, last = 0, None
        phase = self._phase("answer", prompt, cfg, prefill, constraint, plan.suffix_ids, stop_ids)
        async for ev in phase:
            last = ev
            committed.update(ev.committed)
            n_tokens += len(ev.new_tokens)
            out += ev.new_tokens
            text = cutter.push(detok.push(ev.new_tokens)) if ev.new_tokens else ""
            if ev.done and not cutter.hit:
                text += cutter.push(detok.flush())
                text += cutter.flush()
            self._tick(bool(text))
            if text:
                res.text += text
                yield Delta("content", text)
            if plan.diffusing:
                yield self._canvas("answer", ev)
            if cutter.hit:
                res.finish_reason = "stop"
                self._opened = cutter.hit == OPEN_TAG
                res.stop_string = None if self._opened else cutter.hit
                break
            if ev.done:
                reason = ev.finish_reason or "stop"
                res.finish_reason = (
                    "stop" if plan.canvas is not None and reason == "length" else reason
                )
                self._opened = (
                    calls is not None
                    and reason == "stop"
                    and committed.get(n_tokens) == calls.open_id
                )
                break
        if recorder is not None:
            res.logprobs = recorder.entries(out, {self.served.pad_id, *self.served.stop_ids})
        if cutter.hit == OPEN_TAG:  # the tag spelled out as text: the call goes on from the content
            out[:] = self.served.tokenizer.encode(res.text)
        res.completion_tokens += n_tokens
        self._account(last)

    async def _calls(self, prompt: list[int], calls: CallPlan) -> AsyncGenerator[Delta, None]:
        """Each call on its own schema canvas; between calls, a one-position decision canvas."""
        res, tok = self.result, self.served.tokenizer
        canvas = calls.canvas
        for k in range(calls.max_calls):
            if len(prompt) + canvas.length > self.served.max_context:
                break  # no room for another call: the turn ends with the calls it has
            if k and not await self._another(prompt, calls, k):
                break
            cfg = self.sampler.replace(
                max_new_tokens=canvas.length, record_canvas=self.plan.diffusing
            )
            ids: list[int] = []
            last = None
            async for ev in self._phase(f"call{k}", prompt, cfg, canvas.prefill, canvas.constraint):
                last = ev
                ids += ev.new_tokens
                if self.plan.diffusing:
                    yield self._canvas("tool_call", ev)
                if ev.done:
                    break
            self._account(last)
            self.metrics.inc("structured_requests_total")
            res.completion_tokens += len(ids)
            _, parsed = parse_tool_calls(tok.decode(ids))
            if not parsed:
                break
            self._tick(True)
            res.tool_calls.append(parsed[0])
            res.finish_reason = "tool_calls"
            yield Delta("tool_call", call=parsed[0])
            prompt = prompt + [t for t in ids if t != self.served.pad_id]

    async def _another(self, prompt: list[int], calls: CallPlan, k: int) -> bool:
        """Does another call follow? One canvas position that may hold ``<tool_call>`` or a stop."""
        allowed = [calls.open_id, *self.served.stop_ids]
        cfg = self.sampler.replace(max_new_tokens=1, record_canvas=False)
        out: list[int] = []
        last = None
        async for ev in self._phase(f"more{k}", prompt, cfg, constraint=AllowTokens(allowed)):
            last = ev
            if ev.done:
                out = ev.result.tokens if ev.result is not None else []
                break
        self._account(last)
        return out == [calls.open_id]

    def _account(self, ev: EngineEvent | None) -> None:
        if ev is not None:
            self.result.nfe += ev.nfe
            self.result.steps += ev.result.steps if ev.result is not None else ev.nfe

    def _finish_metrics(self) -> None:
        res, m = self.result, self.metrics
        now = time.perf_counter()
        m.inc("request_success_total", finished_reason=res.finish_reason)
        m.inc("generation_tokens_total", res.completion_tokens)
        m.inc("reasoning_tokens_total", res.reasoning_tokens)
        m.observe("e2e_request_latency_seconds", now - self.arrival)
        m.observe("request_generation_tokens", res.completion_tokens)
        if self.queue_time is not None:
            m.observe("request_queue_time_seconds", self.queue_time)
        if res.nfe:
            m.observe("diffusion_tokens_per_forward", res.completion_tokens / res.nfe)
