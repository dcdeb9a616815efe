"""The models served beside the embedded default: its AR twin and the edit model.

``quicksilver serve`` on the embedded default also loads, each under its own model id:

- ``assets/model-ar`` as ``quicksilver-ar``, the equal-size autoregressive baseline, so that a
  person can race the two on one prompt (the playground's race mode) and a client can compare them
  through the same API. It decodes on its causal decoder with no drafts (``policy="verify"``,
  ``draft=0``: one token per forward pass, its AR output); the canvas of an AR request is simply the
  tokens so far.
- ``assets/model-edit`` as ``quicksilver-edit``, the edit model (Mercury Edit beside Mercury 2): the
  same joint draft-and-verify network trained to merge edits. The apply-edit and next-edit routes
  go to it when a request names it, a Mercury Edit model id (``serving/edit.py`` ``EDIT_ALIASES``) or no model; a
  request naming another served model is served by that one, as asked.

Each runs in an ``Engine`` of its own, like every model, so batching, admission, cancellation,
structured output and metrics are one code path for all. Requests name the model they want;
``ByModel`` hands each to the serving object of that model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..assets import embedded_ar_model_path, embedded_edit_model_path
from ..engine import Engine, EngineConfig
from ..errors import ConfigError
from ..models.checkpoint import load_tokenizer
from ..pipeline import Pipeline, load
from ..sampling.decoders.verify import VerifyDecoder
from .config import ServerConfig
from .served import engine_client, engine_config, pipeline_facts
from .serving.generation import ServedModel

AR_SUFFIX = "-ar"  # the twin's id is the diffusion model's id plus this
EDIT_SUFFIX = "-edit"  # the edit model's id
AR_DEFAULTS = {"policy": "verify", "draft": 0}  # one token per pass: plain AR decoding


def beside_default(cfg: ServerConfig, flag: bool) -> bool:
    """Whether a companion may be served: ``flag`` is on and the server runs the embedded default
    (no ``--model``, no ``--mock``)."""
    return flag and not cfg.mock and cfg.model is None


def build_twin(cfg: ServerConfig, name: str) -> ServedModel | None:
    """The AR twin of the embedded model, named ``name + AR_SUFFIX``, when this build ships one and
    the server runs the embedded default (not ``--no-ar-twin``)."""
    path = embedded_ar_model_path()
    if not beside_default(cfg, cfg.ar_twin) or path is None:
        return None
    return served_twin(path, name + AR_SUFFIX, cfg)


def build_editor(cfg: ServerConfig, name: str) -> ServedModel | None:
    """The edit model, named ``name + EDIT_SUFFIX``, when this build ships one and the server runs
    the embedded default (not ``--no-edit-model``)."""
    path = embedded_edit_model_path()
    if not beside_default(cfg, cfg.edit_model) or path is None:
        return None
    return served_editor(path, name + EDIT_SUFFIX, cfg)


def build_companions(cfg: ServerConfig, name: str) -> list[ServedModel]:
    """Every model served beside the default one named ``name``: its AR twin, its edit model."""
    return [m for m in (build_twin(cfg, name), build_editor(cfg, name)) if m is not None]


def served_twin(path: Path, name: str, cfg: ServerConfig) -> ServedModel:
    """A causal checkpoint served under ``name`` by the engine, decoding one token per pass."""
    client, facts = engine_client(cfg, partial(twin_engine, path, cfg))
    return ServedModel(name, load_tokenizer(path), client, **facts)


def served_editor(path: Path, name: str, cfg: ServerConfig) -> ServedModel:
    """A checkpoint served under ``name`` as the edit routes' default model (its own decoding
    defaults: drafts and copy drafts, greedy verify)."""
    client, facts = engine_client(cfg, partial(editor_engine, path, cfg))
    return ServedModel(name, load_tokenizer(path), client, edits=True, **facts)


def _companion_engine(
    path: Path, cfg: ServerConfig, ecfg: EngineConfig, check: Callable[[Pipeline], None]
) -> tuple[Engine, dict[str, Any]]:
    """``path`` loaded with the same load options (runtime among them) as the default model."""
    pipe = load(path, cfg)
    check(pipe)
    pipe.network.eval()
    if cfg.warmup:
        pipe.warm_up()
    return Engine(pipe.decoder, ecfg), pipeline_facts(pipe)


def _causal(pipe: Pipeline) -> None:
    if not isinstance(pipe.decoder, VerifyDecoder):
        raise ConfigError(f"{pipe.path}: the AR twin must be a causal model, not {pipe.attention}")


def twin_engine(path: Path, cfg: ServerConfig) -> tuple[Engine, dict[str, Any]]:
    """The twin's engine (one token per pass, no prefix cache) and its facts."""
    ecfg = EngineConfig(max_batch=cfg.max_batch, max_waiting=cfg.max_waiting, prefix_cache_mb=0)
    engine, facts = _companion_engine(path, cfg, ecfg, _causal)
    facts["defaults"] = {**facts["defaults"], **AR_DEFAULTS}
    return engine, facts


def editor_engine(path: Path, cfg: ServerConfig) -> tuple[Engine, dict[str, Any]]:
    """The edit model's engine (the prefix cache on: every request of a route shares its system
    prompt) and its facts."""
    return _companion_engine(path, cfg, engine_config(cfg), lambda pipe: None)


S = TypeVar("S")


class ByModel(Generic[S]):
    """Hands each request to the serving object of the model its ``model`` field names; requests
    naming no served model go to the default one (which accepts its aliases or answers 404)."""

    def __init__(self, default: S, others: dict[str, S]) -> None:
        self.default, self.others = default, others

    def pick(self, model: str | None) -> S:
        return self.others.get(model or "", self.default)
