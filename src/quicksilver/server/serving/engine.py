"""What every generating endpoint shares (``GenerationServing``): model check, limits, the one place
a request becomes a ``SamplerConfig``, running n choices, the usage and ``diffusion`` extras,
streaming them as SSE, and cancelling them when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

from fastapi import Request

from ...engine import EngineOverloaded
from ...errors import ConfigError
from ...sampling import SamplerConfig
from ..config import MAX_STOP_CHARS, MAX_TOP_LOGPROBS, ServerConfig
from ..metrics import Metrics
from ..protocol.base import DiffusionExtras, usage
from ..protocol.errors import APIError, bad_request, overloaded
from ..protocol.sse import sse
from .budgets import check_prompt
from .generation import EFFORTS, ChoiceResult, ChoiceRunner, Delta, Effort, Plan, ServedModel

T = TypeVar("T")
MODEL_ALIAS = "quicksilver"
Item = tuple[int, Delta | ChoiceResult | BaseException]


class GenerationServing:
    def __init__(self, served: ServedModel, config: ServerConfig, metrics: Metrics) -> None:
        self.served, self.cfg, self.metrics = served, config, metrics

    # ---- checks --------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        """The served name, or ``quicksilver`` (an alias for whatever this server serves), or none."""
        if model and model not in (self.served.name, MODEL_ALIAS):
            raise APIError(
                404,
                f"the model {model!r} does not exist; this server serves {self.served.name!r}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )

    def check_common(
        self,
        n: int | None,
        stop: str | list[str] | None,
        logit_bias: dict[str, float] | None,
        penalties: tuple[float | None, ...],
        top_logprobs: int | None = None,
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
        if top_logprobs is not None and top_logprobs > MAX_TOP_LOGPROBS:
            raise bad_request(
                f"top_logprobs may be at most {MAX_TOP_LOGPROBS}, got {top_logprobs}",
                "top_logprobs",
            )
        return stops

    def check_prompt(self, ids: list[int]) -> None:
        check_prompt(ids, self.cfg.max_prompt_tokens, self.served.max_context, "messages")

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
        opts: dict[str, object] = dict(self.served.defaults)
        if effort_given or extras.realtime or not self.served.defaults:
            opts.update(
                threshold=effort.threshold,
                revise_threshold=effort.revise_threshold,
                max_revisions=effort.max_revisions,
            )
        given = {
            "policy": extras.policy,
            "draft": extras.draft,
            "copy_drafts": extras.copy_drafts,
            "threshold": extras.threshold,
            "steps": extras.steps,
            "block_length": extras.block_length or (8 if extras.realtime else None),
            "window": extras.window,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": extras.top_k,
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
        """One runner per choice (n per plan, seeds seed, seed+1, ...)."""
        out: list[ChoiceRunner] = []
        for p in plans:
            for _ in range(n):
                i = len(out)
                out.append(
                    ChoiceRunner(
                        self.served, p, i, self.metrics, arrival, None if seed is None else seed + i
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


def usage_extras(prompt_tokens: int, results: list[ChoiceResult]) -> dict[str, object]:
    """The response's ``usage`` and quicksilver's ``diffusion`` numbers, summed over its choices."""
    gen = sum(r.completion_tokens for r in results)
    nfe = sum(r.nfe for r in results)
    reasoning = sum(r.reasoning_tokens for r in results)
    cached = results[0].cached_tokens if results else 0
    return {
        "usage": usage(prompt_tokens, gen, reasoning, cached),
        "diffusion": {
            "nfe": nfe,
            "steps": sum(r.steps for r in results),
            "tpf": round(gen / nfe, 3) if nfe else 0.0,
        },
    }


def usage_chunk(
    cid: str, kind: str, created: int, model: str, prompt_tokens: int, results: list[ChoiceResult]
) -> str:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage."""
    return sse(
        {
            "id": cid,
            "object": kind,
            "created": created,
            "model": model,
            "choices": [],
            **usage_extras(prompt_tokens, results),
        }
    )


def map_error(e: BaseException) -> BaseException:
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineOverloaded):
        return overloaded(str(e))
    if isinstance(e, ConfigError):
        return bad_request(str(e))
    return e


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
