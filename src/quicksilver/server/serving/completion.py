"""``POST /v1/completions`` and ``POST /v1/fim/completions``: plain text in, text out.

Fill in the middle (``suffix`` given, or the FIM endpoint): the canvas is the gap between prompt
and suffix. A bidirectional model sees the suffix itself, after the canvas (the decoder's
``suffix`` rows); block-causal and causal models cannot look ahead, so they get the infilling
prompt format ``<|fim_prefix|>{prompt}<|fim_suffix|>{suffix}<|fim_middle|>`` and write the middle.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator

from ..protocol.completion import CompletionRequest
from ..protocol.errors import bad_request
from ..protocol.sse import sse_chunk
from ..reliability.limits import check_strings
from .budgets import check_explicit, split
from .engine import GenerationServing, usage_chunk, usage_extras
from .generation import EFFORTS, ChoiceResult, ChoiceRunner, Delta, Plan
from .logprobs import completion_logprobs

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


class OpenAIServingCompletion(GenerationServing):
    def _prompts(self, req: CompletionRequest) -> list[list[int]]:
        p = req.prompt
        tok = self.served.tokenizer
        if isinstance(p, str):
            return [tok.encode(p)]
        if not p:
            raise bad_request("the prompt is empty", "prompt")
        if all(isinstance(x, int) for x in p):
            ids = [int(x) for x in p]
            if any(not 0 <= t < tok.vocab_size for t in ids):
                raise bad_request(f"prompt token ids must lie in [0, {tok.vocab_size})", "prompt")
            return [ids]
        if len(p) > self.cfg.max_n:
            raise bad_request(f"at most {self.cfg.max_n} prompts per request", "prompt")
        return [tok.encode(str(x)) for x in p]

    def plans(self, req: CompletionRequest, fim: bool) -> list[Plan]:
        self.check_model(req.model)
        check_strings(req.model_dump(exclude_none=True))
        stops = self.check_common(
            req.n,
            req.stop,
            req.logit_bias,
            (req.frequency_penalty, req.presence_penalty),
            req.logprobs,
        )
        c = self.cfg
        if (req.n or 1) * (
            len(req.prompt)
            if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], str)
            else 1
        ) > self.cfg.max_n:
            raise bad_request(
                f"prompts times n is above this server's limit of {self.cfg.max_n}", "n"
            )
        if req.best_of not in (None, 1, req.n):
            raise bad_request("best_of is not supported", "best_of")
        effort = EFFORTS["instant" if req.realtime else "none"]
        sampler = self.sampler(
            req, effort, req.temperature, req.top_p, req.seed, effort_given=bool(req.realtime)
        )
        plans = []
        for ids in self._prompts(req):
            suffix_ids = None
            if fim or req.suffix is not None:
                if not isinstance(req.prompt, str):
                    raise bad_request("fill-in-the-middle takes one prompt string", "prompt")
                ids, suffix_ids = self._fim(req.prompt, req.suffix or "")
            self.check_prompt(ids + (suffix_ids or []))
            prompt = len(ids) + len(suffix_ids or [])
            room = self.served.max_context - prompt
            check_explicit(
                req.max_tokens, room, c.max_tokens, self.served.max_context, prompt, "max_tokens"
            )
            answer = split(room, req.max_tokens, 0, min(c.default_max_tokens, c.max_tokens)).answer
            plans.append(
                Plan(
                    ids,
                    sampler,
                    answer,
                    0,
                    suffix_ids=suffix_ids,
                    stop=stops,
                    diffusing=bool(req.diffusing),
                    logprobs=req.logprobs,
                )
            )
        return plans

    def _fim(self, prefix: str, suffix: str) -> tuple[list[int], list[int] | None]:
        tok = self.served.tokenizer
        if self.served.attention == "bidirectional":
            pre = tok.encode(prefix)
            if not pre:
                raise bad_request("fill-in-the-middle needs a non-empty prompt", "prompt")
            return pre, tok.encode(suffix) or None
        ids = [tok.token_to_id(t) for t in FIM_TOKENS]
        if any(i is None for i in ids):
            raise bad_request(
                "this model is not bidirectional and has no fill-in-the-middle tokens", "suffix"
            )
        p, s, m = (int(i) for i in ids if i is not None)
        return [p] + tok.encode(prefix) + [s] + tok.encode(suffix) + [m], None

    def _result(self, req: CompletionRequest, plans: list[Plan]) -> tuple[str, int, int]:
        return f"cmpl-{uuid.uuid4().hex}", int(time.time()), sum(len(p.prompt_ids) for p in plans)

    def _logprobs(self, r: ChoiceResult) -> dict[str, object] | None:
        return (
            None if r.logprobs is None else completion_logprobs(self.served.tokenizer, r.logprobs)
        )

    async def create(self, req: CompletionRequest, arrival: float, fim: bool) -> dict[str, object]:
        plans = await asyncio.to_thread(self.plans, req, fim)  # off the event loop
        results = await self.collect(self.runners(plans, req.n or 1, req.seed, arrival))
        n = req.n or 1
        choices = []
        for r in results:
            text = r.text
            if req.echo and not fim and isinstance(req.prompt, (str, list)):
                text = self.served.tokenizer.decode(plans[r.index // n].prompt_ids) + text
            choices.append(
                {
                    "index": r.index,
                    "text": text,
                    "logprobs": self._logprobs(r),
                    "finish_reason": r.finish_reason,
                }
            )
        cid, created, prompt_tokens = self._result(req, plans)
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": self.served.name,
            "choices": choices,
            **usage_extras(prompt_tokens, results),
        }

    def stream(
        self, req: CompletionRequest, arrival: float, fim: bool
    ) -> AsyncGenerator[str, None]:
        plans = self.plans(req, fim)
        runners = self.runners(plans, req.n or 1, req.seed, arrival)
        return self._stream(req, plans, runners)

    async def _stream(
        self, req: CompletionRequest, plans: list[Plan], runners: list[ChoiceRunner]
    ) -> AsyncGenerator[str, None]:
        cid, created, prompt_tokens = self._result(req, plans)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def chunk(index: int, text: str, finish: str | None = None, **extra: object) -> str:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            return sse_chunk(
                cid,
                "text_completion",
                created,
                self.served.name,
                {**choice, **extra},
                include_usage,
            )

        results = []
        async for i, item in self.merged(runners):
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, Delta):
                if item.kind == "canvas":
                    yield chunk(i, "", canvas=item.canvas)
                elif item.text:
                    yield chunk(i, item.text)
                continue
            results.append(item)
            lp = self._logprobs(item)
            yield chunk(i, "", item.finish_reason, **({"logprobs": lp} if lp else {}))
        if include_usage:
            yield usage_chunk(
                cid, "text_completion", created, self.served.name, prompt_tokens, results
            )
        yield "data: [DONE]\n\n"
