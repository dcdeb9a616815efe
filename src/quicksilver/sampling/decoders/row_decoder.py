"""The one decoder contract: what a row is to the engine, and the loop every decoder shares.

A decoder makes a row per request (``new_row``) and advances a batch of its rows by one forward
pass (``step``); everything else — checking a request against the model, running rows to the end
(``drive``, ``generate``), handing caches back — is written once here. ``Decoder`` (diffusion
canvases), ``VerifyDecoder`` (causal drafting and verifying), ``NoiseCanvasDecoder``
(DiffusionGemma's canvases of uniform noise) and the mock engine's scripted decoder each write only
their row type and their step.

``RowLike`` is what the engine, the prefix cache and the live views read of any row.
"""

from __future__ import annotations

import abc
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from ...errors import ConfigError
from ..core.config import SamplerConfig
from ..core.hooks import Constraint
from ..core.state import DecodeResult, RowEvent

if TYPE_CHECKING:
    from ...models.kvcache import KVCache


def row_stops(
    stop_ids: frozenset[int], extra_stops: Sequence[int] | None, at_eos: bool = True
) -> frozenset[int]:
    """The token ids that end a row: the model's stops (when ``at_eos``) and the request's own."""
    return (stop_ids if at_eos else frozenset()) | frozenset(int(t) for t in extra_stops or ())


class RowLike(Protocol):
    """One request being decoded, as the engine sees it."""

    P: int  # prompt tokens
    nfe: int  # forward passes this row took part in
    done: bool
    cfg: SamplerConfig
    cache_mode: str  # a name from sampling.core.caches.CACHE_MODES, or "verify"
    prompt_ids: list[int]
    host_tokens: list[int]  # the canvas as the host knows it (final tokens first)

    @property
    def cache(self) -> KVCache | None:
        """The row's own KV cache (None: the model runs uncached)."""
        ...

    def input_len(self) -> int:
        """Tokens this row feeds to its next forward pass."""
        ...

    def host_sequence(self) -> list[int]:
        """Prompt + the tokens the row's cache may hold keys and values of."""
        ...

    def exact_prefix(self) -> int:
        """Cached positions whose keys and values are final (what a prefix cache may keep)."""
        ...

    def take_prefix(self, n: int) -> None:
        """The first ``n`` prompt positions were bound from a prefix cache."""
        ...

    def result(self) -> DecodeResult: ...


class ModelShape(Protocol):
    """What the shared checks and the engine read of a model's config (``ModelConfig``, or a
    family's own, e.g. DiffusionGemma's, whose block is its canvas)."""

    @property
    def max_seq_len(self) -> int: ...

    @property
    def block_size(self) -> int: ...


class HasConfig(Protocol):
    """What the shared checks read of a model."""

    @property
    def config(self) -> ModelShape: ...


R = TypeVar("R", bound=RowLike)


class RowDecoder(abc.ABC, Generic[R]):
    """Rows of one model: made per request, stepped in batches, run to the end."""

    # what runs the rows' passes (a Runtime, or a family's network that runs itself): its
    # ``config`` sizes requests and the prefix cache
    runtime: HasConfig
    step_count: int = 0

    @abc.abstractmethod
    def new_row(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        tag: object = None,
        prefill: dict[int, int] | None = None,
        suffix: Sequence[int] | None = None,
        constraint: Constraint | None = None,
        extra_stops: Sequence[int] | None = None,
    ) -> R:
        """A row for one request (``check_request`` first)."""

    @abc.abstractmethod
    def step(self, rows: Sequence[R]) -> list[RowEvent]:
        """One forward pass over the live rows of ``rows``; one event per live row."""

    def resolve_cache_mode(self) -> str:
        """The cache mode this decoder's rows use (sampling.core.caches.CACHE_MODES, or "verify")."""
        return "none"

    def check_request(
        self,
        prompt_ids: Sequence[int],
        cfg: SamplerConfig,
        prefill: dict[int, int] | None,
        suffix_len: int = 0,
    ) -> None:
        """The checks every decoder makes before building a row (ConfigError on a bad request)."""
        cfg.validate(self.runtime.config.max_seq_len, len(prompt_ids) + suffix_len)
        if prefill and any(not 0 <= p < cfg.max_new_tokens for p in prefill):
            raise ConfigError("prefilled positions must lie inside the canvas")

    def drive(self, rows: Sequence[R]) -> Generator[list[RowEvent], None, list[DecodeResult]]:
        """Step ``rows`` until all are done, yielding each step's events; their results, caches
        handed back."""
        try:
            while any(not r.done for r in rows):
                yield self.step(rows)
            return [r.result() for r in rows]
        finally:
            for r in rows:
                release(r)

    def run(
        self, prompts: Sequence[Sequence[int]], cfgs: SamplerConfig | Sequence[SamplerConfig]
    ) -> Generator[list[RowEvent], None, list[DecodeResult]]:
        """Decode a fixed batch to the end, yielding each step's events; one result per prompt."""
        if isinstance(cfgs, SamplerConfig):
            cfgs = [cfgs] * len(prompts)
        return self.drive([self.new_row(p, c) for p, c in zip(prompts, cfgs)])

    def generate(
        self, prompts: Sequence[Sequence[int]], cfgs: SamplerConfig | Sequence[SamplerConfig]
    ) -> list[DecodeResult]:
        """``run`` to the end: one result per prompt."""
        gen = self.run(prompts, cfgs)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value


def release(row: RowLike) -> None:
    """Hand a row's cache memory back to its model's pool."""
    if row.cache is not None:
        row.cache.release()
