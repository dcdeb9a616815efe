"""Helpers for the command line: dataclass fields become flags (1:1), the flags several commands
share, errors become one line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from .pipeline import LOAD_CHOICES, LOAD_HELP, LoadConfig

T = TypeVar("T")

MODEL_HELP = "checkpoint directory or Hub id org/name[@revision] (docs/FAMILIES.md)"

_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def _parse_type(annotation: str) -> tuple[Callable[[str], Any] | None, bool]:
    """('int | None') -> (int, optional). Returns (None, _) for bools and unsupported types."""
    parts = [p.strip() for p in str(annotation).split("|")]
    optional = "None" in parts
    parts = [p for p in parts if p != "None"]
    if len(parts) != 1 or parts[0] not in _TYPES:
        return None, optional
    return _TYPES[parts[0]], optional


def add_dataclass_args(
    parser: argparse.ArgumentParser,
    cls: type,
    rename: dict[str, str] | None = None,
    skip: set[str] | frozenset[str] = frozenset(),
    help: dict[str, str] | None = None,
    choices: dict[str, Sequence[str]] | None = None,
) -> None:
    """One flag per dataclass field (``--field-name``; bools get ``--x/--no-x``); defaults stay in the class."""
    rename, help, choices = rename or {}, help or {}, choices or {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + rename.get(f.name, f.name.replace("_", "-"))
        default = f.default if f.default is not dataclasses.MISSING else None
        text = help.get(f.name, "") + (f" (default: {default})" if default is not None else "")
        if f.type in ("bool", bool):
            parser.add_argument(
                flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=text
            )
            continue
        typ, _ = _parse_type(f.type if isinstance(f.type, str) else f.type.__name__)
        if typ is None:
            continue
        allowed = choices.get(f.name)
        parser.add_argument(
            flag,
            dest=f.name,
            type=typ,
            default=None,
            help=text,
            choices=allowed,
            metavar=None if allowed else f.name.upper(),
        )


def dataclass_from_args(
    cls: type[T], args: argparse.Namespace, base: T | None = None, **extra: Any
) -> T:
    """Build ``cls`` from the flags that were given (others keep ``base``'s or the class defaults)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    given.update(extra)
    if base is not None:
        return dataclasses.replace(base, **given)  # type: ignore[type-var]
    return cls(**given)


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"quicksilver: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def add_load_args(p: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """The ``LoadConfig`` flags (all but ``skip``), their help and choices from ``pipeline``."""
    add_dataclass_args(p, LoadConfig, skip=skip, help=LOAD_HELP, choices=LOAD_CHOICES)


def add_revision_arg(p: argparse.ArgumentParser) -> None:
    """``--revision`` beside a ``--model`` of a parser without the ``LoadConfig`` flags (those
    have it as ``LoadConfig.revision``)."""
    p.add_argument("--revision", help=LOAD_HELP["revision"])
