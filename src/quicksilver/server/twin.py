"""The AR twin: the embedded model's equal-size autoregressive baseline, served beside it.

``quicksilver serve`` on the embedded default also loads ``assets/model-ar`` under its own model id
(``quicksilver-ar``) so that a person can race the two on one prompt (the playground's race mode)
and a client can compare them through the same API. Requests name the model they want; ``ByModel``
hands each to the serving object of that model.

The twin runs in the same ``Engine`` as every model, on its causal decoder with no drafts
(``policy="verify"``, ``draft=0``: one token per forward pass, its AR output), so batching,
admission, cancellation, structured output and metrics are one code path for both models. The
canvas of an AR request is simply the tokens so far: no masked positions, one committed per pass.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..assets import embedded_ar_model_path
from ..engine import Engine, EngineConfig
from ..errors import ConfigError
from ..models.checkpoint import load_tokenizer
from ..pipeline import load
from ..sampling.decoders.verify import VerifyDecoder
from .config import ServerConfig
from .served import engine_client, pipeline_facts
from .serving.generation import ServedModel

AR_SUFFIX = "-ar"  # the twin's id is the diffusion model's id plus this
AR_DEFAULTS = {"policy": "verify", "draft": 0}  # one token per pass: plain AR decoding


def build_twin(cfg: ServerConfig, name: str) -> ServedModel | None:
    """The AR twin of the embedded model, named ``name + AR_SUFFIX``, when this build ships one and
    the server runs the embedded default (no ``--model``, no ``--mock``, not ``--no-ar-twin``)."""

    path = embedded_ar_model_path()
    if not cfg.ar_twin or cfg.mock or cfg.model is not None or path is None:
        return None
    return served_twin(path, name + AR_SUFFIX, cfg)


def served_twin(path: Path, name: str, cfg: ServerConfig) -> ServedModel:
    """A causal checkpoint served under ``name`` by the engine, decoding one token per pass."""
    client, facts = engine_client(cfg, partial(twin_engine, path, cfg))
    return ServedModel(name, load_tokenizer(path), client, **facts)


def twin_engine(path: Path, cfg: ServerConfig) -> tuple[Engine, dict[str, Any]]:
    """The twin's engine (one token per pass, no prefix cache) and its facts."""
    pipe = load(
        path, cfg
    )  # the same load options (runtime among them) as the model it is raced against
    if not isinstance(pipe.decoder, VerifyDecoder):
        raise ConfigError(f"{path}: the AR twin must be a causal model, not {pipe.attention}")
    pipe.network.eval()
    if cfg.warmup:
        pipe.warm_up()
    ecfg = EngineConfig(max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=0)
    facts = pipeline_facts(pipe)
    facts["defaults"] = {**facts["defaults"], **AR_DEFAULTS}
    return Engine(pipe.decoder, ecfg), facts


S = TypeVar("S")


class ByModel(Generic[S]):
    """Hands each request to the serving object of the model its ``model`` field names; requests
    naming no served model go to the default one (which accepts its aliases or answers 404)."""

    def __init__(self, default: S, others: dict[str, S]) -> None:
        self.default, self.others = default, others

    def pick(self, model: str | None) -> S:
        return self.others.get(model or "", self.default)
