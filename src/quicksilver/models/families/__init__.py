"""The open diffusion LM families quicksilver loads from a local directory, one module per family.

A ``Family`` names the ``config.json`` ``architectures`` it answers to (dispatch never uses
``model_type``: LLaDA-MoE reuses LLaDA's), the loader that maps the config onto ``ModelConfig`` and
the weight names onto ours, the tokenizer loader (special-token roles the files leave out, stop
tokens), and the family's published decoding settings. Importing this package registers them all
in ``models.checkpoint``.

Decoding defaults: ``generation_defaults(architecture, path)`` returns SamplerConfig fields — the
family's published settings, overlaid by a ``sampler_config.json`` in the checkpoint directory
(same field names as the CLI flags), if there is one. ``Pipeline.sampler_config`` starts from
these and applies each request's options on top.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import CheckpointError
from ..checkpoint import LOADERS, TOKENIZER_LOADERS, Loader, TokenizerLoader

SAMPLER_CONFIG_FILE = "sampler_config.json"


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    load: Loader
    tokenizer: TokenizerLoader | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # SamplerConfig fields
    checkpoints: tuple[str, ...] = ()  # published checkpoints of this family (docs, `info`)
    doc: str = ""


FAMILIES: dict[str, Family] = {}  # by name
BY_ARCHITECTURE: dict[str, Family] = {}


def register_family(fam: Family) -> Family:
    FAMILIES[fam.name] = fam
    for arch in fam.architectures:
        BY_ARCHITECTURE[arch] = fam
        LOADERS[arch] = fam.load
        if fam.tokenizer is not None:
            TOKENIZER_LOADERS[arch] = fam.tokenizer
    return fam


def family_of(architecture: str) -> Family | None:
    return BY_ARCHITECTURE.get(architecture)


def generation_defaults(
    architecture: str, path: str | Path | None = None, known: Collection[str] | None = None
) -> dict[str, Any]:
    """Decoding options (SamplerConfig fields): the family's published settings, then the
    checkpoint's ``sampler_config.json``, whose keys must be among ``known`` (the caller's option
    names; the sampler sits above this layer)."""
    fam = family_of(architecture)
    out = dict(fam.defaults) if fam is not None else {}
    if path is not None and (Path(path) / SAMPLER_CONFIG_FILE).is_file():
        from ..checkpoint import read_json_object

        f = Path(path) / SAMPLER_CONFIG_FILE
        extra = read_json_object(f, "a JSON object of sampler options")
        unknown = sorted(set(extra) - set(known)) if known is not None else []
        if unknown:
            raise CheckpointError(f"{f}: unknown sampler options {unknown}")
        out.update(extra)
    return out


from . import dream, idlm, llada, llada_moe, qwen_block  # noqa: E402,F401  (registers the families)

__all__ = [
    "Family",
    "FAMILIES",
    "BY_ARCHITECTURE",
    "register_family",
    "family_of",
    "generation_defaults",
]
