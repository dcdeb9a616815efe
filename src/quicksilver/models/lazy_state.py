"""A checkpoint's tensors read one at a time: ``LazyState``, a mapping of name -> tensor over
safetensors files (one, or the shards of an index) whose values are read when asked for.

A quantized load (runtime/ov_graph.py) asks for each weight once, compresses it and lets it go, so
its peak memory is about the compressed weights, not the checkpoint; a float load reads each tensor
once as it assigns it. Names, shapes and dtypes come from the files' headers without reading data;
every tensor is checked for NaN and infinity as it is read (integrity.py's rule).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..errors import CheckpointError
from .integrity import check_finite


class LazyState(Mapping[str, torch.Tensor]):
    """name -> tensor over safetensors files, read on access (see the module docstring)."""

    def __init__(self, where: Path, index: dict[str, tuple[Path, str]]) -> None:
        self.where = where  # what errors name: the file or the index
        self.index = index  # our name -> (file, name in the file)
        self._handles: dict[Path, Any] = {}

    @classmethod
    def of_files(cls, where: Path, files: list[Path]) -> LazyState:
        """Every tensor of ``files`` under its own name (a name in two files is an error)."""
        state = cls(where, {})
        for f in files:
            for key in state._handle(f).keys():
                if key in state.index:
                    raise CheckpointError(f"{where}: tensor {key!r} is in two shards")
                state.index[key] = (f, key)
        return state

    def _handle(self, f: Path) -> Any:
        if f not in self._handles:
            self._handles[f] = safe_open(str(f), framework="pt")
        return self._handles[f]

    def __getitem__(self, name: str) -> torch.Tensor:
        f, key = self.index[name]
        t = self._handle(f).get_tensor(key)
        check_finite({name: t}, self.where)
        return t

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, from the file's header (no data read)."""
        f, key = self.index[name]
        return tuple(self._handle(f).get_slice(key).get_shape())

    def renamed(self, names: Mapping[str, str]) -> LazyState:
        """The same files under new names (``names``: new -> old), still unread."""
        out = LazyState(self.where, {new: self.index[old] for new, old in names.items()})
        out._handles = self._handles
        return out


def shape_of(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """A tensor's shape without reading it where the state is lazy."""
    return state.shape(name) if isinstance(state, LazyState) else tuple(state[name].shape)
