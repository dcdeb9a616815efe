"""What every generating endpoint shares: model check, limits, sampler settings, running n choices,
streaming them as SSE, and cancelling them when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypeVar

from fastapi import Request

from ..engine import EngineOverloaded
from ..errors import ConfigError
from ..sampling import SamplerConfig
from .config import MAX_STOP_CHARS, ServerConfig
from .errors import APIError, bad_request, overloaded
from .generation import EFFORTS, Backend, ChoiceResult, ChoiceRunner, Delta, Effort, Plan
from .metrics import Metrics
from .protocol import DiffusionExtras

T = TypeVar("T")
MODEL_ALIAS = "quicksilver"
Item = tuple[int, Delta | ChoiceResult | BaseException]


class OpenAIServing:
    def __init__(self, backend: Backend, config: ServerConfig, metrics: Metrics) -> None:
        self.b, self.cfg, self.metrics = backend, config, metrics

    # ---- checks --------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        """The served name, or ``quicksilver`` (an alias for whatever this server serves), or none."""
        if model and model not in (self.b.name, MODEL_ALIAS):
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.b.name!r}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )

    def check_common(
        self,
        n: int | None,
        stop: str | list[str] | None,
        logit_bias: Any,
        penalties: tuple[Any, ...],
        logprobs: Any,
    ) -> list[str]:
        if (n or 1) > self.cfg.max_n:
            raise bad_request(f"n={n} is above this server's limit of {self.cfg.max_n}", "n")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > self.cfg.max_stop:
            raise bad_request(
                f"at most {self.cfg.max_stop} stop strings are allowed, got {len(stops)}", "stop"
            )
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise bad_request(f"a stop string may have at most {MAX_STOP_CHARS} characters", "stop")
        if logit_bias:
            raise bad_request("logit_bias is not supported", "logit_bias")
        if any(p for p in penalties):
            raise bad_request(
                "frequency_penalty and presence_penalty are not supported by diffusion decoding",
                "presence_penalty",
            )
        if logprobs:
            raise bad_request("logprobs are not supported yet", "logprobs")
        return stops

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise bad_request("the prompt is empty", "prompt")
        limit = min(self.cfg.max_prompt_tokens, self.b.max_context - 1)
        if len(ids) > limit:
            raise bad_request(
                f"the prompt has {len(ids)} tokens; at most {limit} are accepted",
                "messages",
                "context_length_exceeded",
            )

    def budgets(
        self, prompt_len: int, max_tokens: int | None, reasoning: int, param: str = "max_tokens"
    ) -> tuple[int, int]:
        """(answer canvas, reasoning budget): the answer's max_tokens is never shared with reasoning."""
        room = self.b.max_context - prompt_len
        if max_tokens is not None:
            if max_tokens > self.cfg.max_tokens:
                raise bad_request(
                    f"{param}={max_tokens} is above this server's limit of {self.cfg.max_tokens}",
                    param,
                )
            if max_tokens > room:
                raise bad_request(
                    f"{param}={max_tokens} plus a prompt of {prompt_len} tokens exceeds the context "
                    f"of {self.b.max_context}; at most {room} fit",
                    param,
                    "context_length_exceeded",
                )
            answer = max_tokens
        else:
            answer = max(
                1,
                min(
                    self.cfg.default_max_tokens,
                    max(room - reasoning, room // 2),
                    self.cfg.max_tokens,
                ),
            )
        think = min(reasoning, self.cfg.max_reasoning_tokens, room - answer - 2)
        return answer, think if think >= 8 else 0

    def effort(self, name: str | None, extras: DiffusionExtras, can_reason: bool) -> Effort:
        if name is None:
            name = "instant" if extras.realtime else ("medium" if can_reason else "none")
        e = EFFORTS[name]
        return e if can_reason else Effort(0, e.threshold, e.revise_threshold, e.max_revisions)

    def sampler(
        self,
        extras: DiffusionExtras,
        effort: Effort,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        effort_given: bool = True,
    ) -> SamplerConfig:
        """Settings in order of precedence: the request's explicit fields, then the reasoning effort
        (when the request names one, asks for realtime, or the model has no published defaults),
        then the model family's / checkpoint's defaults, then ``SamplerConfig``'s."""
        opts: dict[str, Any] = dict(self.b.defaults)
        if effort_given or extras.realtime or not self.b.defaults:
            opts.update(
                threshold=effort.threshold,
                revise_threshold=effort.revise_threshold,
                max_revisions=effort.max_revisions,
            )
        given = {
            "policy": extras.policy,
            "threshold": extras.threshold,
            "steps": extras.steps,
            "block_length": extras.block_length or (8 if extras.realtime else None),
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
        }
        opts.update({k: v for k, v in given.items() if v is not None})
        opts.setdefault("temperature", 0.0)
        if extras.ignore_eos:
            opts["stop_at_eos"] = False
        try:
            return SamplerConfig().replace(**opts).validate()
        except (ConfigError, TypeError) as e:
            raise bad_request(str(e)) from None

    # ---- running choices -----------------------------------------------------------------------
    def runners(
        self, plans: list[Plan], n: int, seed: int | None, arrival: float
    ) -> list[ChoiceRunner]:
        out: list[ChoiceRunner] = []
        for p in plans:
            for _ in range(n):
                i = len(out)
                out.append(
                    ChoiceRunner(
                        self.b, p, i, self.metrics, arrival, None if seed is None else seed + i
                    )
                )
        for p in plans:
            self.metrics.inc("prompt_tokens_total", len(p.prompt_ids) * n)
            self.metrics.observe("request_prompt_tokens", len(p.prompt_ids))
        return out

    async def merged(self, runners: list[ChoiceRunner]) -> AsyncGenerator[Item, None]:
        """Run the choices concurrently; yield (index, Delta) as they come and (index, ChoiceResult) at
        each end. Closing this generator cancels every choice (and so its engine request)."""
        q: asyncio.Queue[Item] = asyncio.Queue()

        async def drive(r: ChoiceRunner) -> None:
            try:
                async with contextlib.aclosing(r.run()) as deltas:
                    async for d in deltas:
                        await q.put((r.result.index, d))
                await q.put((r.result.index, r.result))
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # reported to the consumer, which ends the response
                await q.put((r.result.index, map_error(e)))

        tasks = [asyncio.create_task(drive(r)) for r in runners]
        left = len(tasks)
        try:
            while left:
                i, item = await q.get()
                if not isinstance(item, Delta):
                    left -= 1
                yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def collect(self, runners: list[ChoiceRunner]) -> list[ChoiceResult]:
        results: dict[int, ChoiceResult] = {}
        async with contextlib.aclosing(self.merged(runners)) as items:
            async for i, item in items:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, ChoiceResult):
                    results[i] = item
        return [results[i] for i in sorted(results)]


def map_error(e: BaseException) -> BaseException:
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineOverloaded):
        return overloaded(str(e))
    if isinstance(e, ConfigError):
        return bad_request(str(e))
    return e


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_chunk(
    cid: str, kind: str, created: int, model: str, choice: dict[str, Any], include_usage: bool
) -> str:
    """One streamed chunk with a single choice; ``usage: null`` on every chunk when the client asked for
    a usage chunk at the end (the OpenAI convention)."""
    obj: dict[str, Any] = {
        "id": cid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if include_usage:
        obj["usage"] = None
    return sse(obj)


async def sse_guard(gen: AsyncGenerator[str, None], metrics: Metrics) -> AsyncGenerator[str, None]:
    """Wraps a stream: an error mid-stream becomes one error event; a client that goes away (the
    response task is cancelled) closes the inner generator, which cancels the engine requests."""
    finished = False
    try:
        async with contextlib.aclosing(gen) as inner:
            async for chunk in inner:
                yield chunk
        finished = True
    except APIError as e:
        finished = True
        if e.status in (429, 503):  # refused after the stream began (the engine queue filled)
            metrics.inc("requests_rejected_total", reason="overloaded")
        yield sse(e.body())
        yield "data: [DONE]\n\n"
    except Exception as e:  # never a traceback to the client
        finished = True
        yield sse(
            {
                "error": {
                    "message": f"internal error: {type(e).__name__}",
                    "type": "server_error",
                    "param": None,
                    "code": "internal_error",
                }
            }
        )
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            metrics.inc("requests_aborted_total")


async def until_disconnect(request: Request, work: Awaitable[T], metrics: Metrics) -> T:
    """Run a non-streaming handler's work; if the client disconnects first, cancel it (and with it
    the engine requests) instead of finishing a response nobody will read."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    metrics.inc("requests_aborted_total")
    raise APIError(
        499, "client disconnected", "invalid_request_error", None, "client_closed_request"
    )
