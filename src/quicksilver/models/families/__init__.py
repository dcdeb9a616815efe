"""The open diffusion LM families quicksilver loads from a local directory, one module per family.

A ``Family`` names the ``config.json`` ``architectures`` it answers to (dispatch never uses
``model_type``: LLaDA-MoE reuses LLaDA's), the loader that maps the config onto ``ModelConfig`` and
the weight names onto ours, the tokenizer loader (special-token roles the files leave out, stop
tokens), and the family's published decoding settings. Importing this package registers them all
in ``models.checkpoint``.

Decoding defaults: ``generation_defaults(architecture, path)`` returns SamplerConfig fields — the
family's published settings, then those of its named decoding mode (the one asked for, else the
one the family picks for this checkpoint, e.g. LLaDA2.1's "quality"), overlaid by a
``sampler_config.json`` in the checkpoint directory (same field names as the CLI flags), if there
is one. ``Pipeline.sampler_config`` starts from
these and applies each request's options on top.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from ...errors import CheckpointError, ConfigError
from ..checkpoint import read_json_object
from . import (  # noqa: F401  (registers the families)
    diffusion_gemma,
    dream,
    idlm,
    llada,
    llada_moe,
    qwen_block,
)
from .registry import BY_ARCHITECTURE, FAMILIES, Family, family_of, register_family

SAMPLER_CONFIG_FILE = "sampler_config.json"


def generation_defaults(
    architecture: str,
    path: str | Path | None = None,
    known: Collection[str] | None = None,
    mode: str | None = None,
) -> dict[str, Any]:
    """Decoding options (SamplerConfig fields): the family's published settings, then its decoding
    ``mode`` (None: the one the family picks for the checkpoint at ``path``, if any), then the
    checkpoint's ``sampler_config.json``, whose keys must be among ``known`` (the caller's option
    names; the sampler sits above this layer)."""
    fam = family_of(architecture)
    out = dict(fam.defaults) if fam is not None else {}
    modes = fam.modes if fam is not None else {}
    if mode is None and fam is not None and fam.default_mode is not None and path is not None:
        cfg = Path(path) / "config.json"
        cj = read_json_object(cfg, "a JSON object") if cfg.is_file() else {}
        mode = fam.default_mode(Path(path), cj)
    if mode is not None:
        if mode not in modes:
            raise ConfigError(
                f"decoding mode {mode!r} is not one of this model's: {sorted(modes) or 'none'}"
            )
        out.update(modes[mode])
    if path is not None and (Path(path) / SAMPLER_CONFIG_FILE).is_file():
        f = Path(path) / SAMPLER_CONFIG_FILE
        extra = read_json_object(f, "a JSON object of sampler options")
        unknown = sorted(set(extra) - set(known)) if known is not None else []
        if unknown:
            raise CheckpointError(f"{f}: unknown sampler options {unknown}")
        out.update(extra)
    return out


__all__ = [
    "Family",
    "FAMILIES",
    "BY_ARCHITECTURE",
    "register_family",
    "family_of",
    "generation_defaults",
]
