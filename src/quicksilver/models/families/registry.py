"""The registry of families: each family module registers its ``Family`` here, which also puts its
loaders where ``models.checkpoint`` dispatches on a config's ``architectures``: ``load`` for the
families the generic transformer runs, ``network`` for those with a network of their own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint import (
    LOADERS,
    NETWORK_LOADERS,
    NETWORK_READERS,
    TOKENIZER_LOADERS,
    Loader,
    NetworkLoader,
    NetworkReader,
    TokenizerLoader,
)


@dataclass(frozen=True)
class Family:
    name: str
    architectures: tuple[str, ...]
    load: Loader | None = None  # config + weights for the generic transformer ...
    network: NetworkLoader | None = None  # ... or the family's own network
    reader: NetworkReader | None = None  # ... that network with its weights set by the caller
    tokenizer: TokenizerLoader | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # SamplerConfig fields
    # named decoding modes, SamplerConfig fields over `defaults` (LLaDA2.1: "quality", "speed")
    modes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the mode a checkpoint directory decodes in unless one is asked for (None: `defaults` alone)
    default_mode: Callable[[Path, dict[str, Any]], str | None] | None = None
    checkpoints: tuple[str, ...] = ()  # published checkpoints of this family (docs, `info`)
    doc: str = ""


FAMILIES: dict[str, Family] = {}  # by name
BY_ARCHITECTURE: dict[str, Family] = {}


def register_family(fam: Family) -> Family:
    FAMILIES[fam.name] = fam
    for arch in fam.architectures:
        BY_ARCHITECTURE[arch] = fam
        if fam.load is not None:
            LOADERS[arch] = fam.load
        if fam.network is not None:
            NETWORK_LOADERS[arch] = fam.network
        if fam.reader is not None:
            NETWORK_READERS[arch] = fam.reader
        if fam.tokenizer is not None:
            TOKENIZER_LOADERS[arch] = fam.tokenizer
    return fam


def family_of(architecture: str) -> Family | None:
    return BY_ARCHITECTURE.get(architecture)
