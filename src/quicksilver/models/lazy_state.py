"""A checkpoint's tensors read one at a time: ``LazyState``, a mapping of name -> tensor over
safetensors files (one, or the shards of an index) whose values are read when asked for.

A quantized load (runtime/ov_graph.py) asks for each weight once, compresses it and lets it go, so
its peak memory is about the compressed weights, not the checkpoint; a float load reads each tensor
once as it assigns it. Names, shapes and dtypes come from the files' headers without reading data;
every tensor is checked for NaN and infinity as it is read (integrity.py's rule). A name may stand
for a run of rows of a stored tensor (``split_rows``: a fused q/k/v split in three), read alone.

Why not ``safetensors.safe_open``: it maps the files, and every page a read touches stays in the
process's resident set while the file is open (a 7 GB float32 checkpoint quantized to int4 peaked
at 9.8 GB). Here a tensor is read with ``pread`` into memory of its own, the format's layout (an
8-byte header length, a JSON header of dtype, shape and byte offsets, then the data) read directly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .integrity import check_finite

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def read_header(f: Path) -> tuple[int, dict[str, Any]]:
    """(where the data starts, the header's tensor entries) of a safetensors file."""
    with f.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


class LazyState(Mapping[str, torch.Tensor]):
    """name -> tensor over safetensors files, read on access (see the module docstring)."""

    def __init__(self, where: Path, index: dict[str, tuple[Path, str]]) -> None:
        self.where = where  # what errors name: the file or the index
        self.index = index  # our name -> (file, name in the file)
        self.rows: dict[
            str, tuple[int, int]
        ] = {}  # our name -> the rows [a, b) it is of its tensor
        self._headers: dict[Path, tuple[int, dict[str, Any]]] = {}

    @classmethod
    def of_files(cls, where: Path, files: list[Path]) -> LazyState:
        """Every tensor of ``files`` under its own name (a name in two files is an error)."""
        state = cls(where, {})
        for f in files:
            for key in state._header(f)[1]:
                if key in state.index:
                    raise CheckpointError(f"{where}: tensor {key!r} is in two shards")
                state.index[key] = (f, key)
        return state

    def _header(self, f: Path) -> tuple[int, dict[str, Any]]:
        if f not in self._headers:
            self._headers[f] = read_header(f)
        return self._headers[f]

    def __getitem__(self, name: str) -> torch.Tensor:
        f, key = self.index[name]
        start, header = self._header(f)
        entry = header[key]
        a, b = entry["data_offsets"]
        shape = list(entry["shape"])
        if name in self.rows:  # only these rows' bytes (a tensor is stored row-major)
            lo, hi = self.rows[name]
            row = (b - a) // shape[0] if shape[0] else 0
            a, b, shape[0] = a + lo * row, a + hi * row, hi - lo
        data = bytearray(b - a)
        with f.open("rb", buffering=0) as fh:
            fh.seek(start + a)
            if fh.readinto(data) != b - a:
                raise CheckpointError(f"{self.where}: tensor {key!r} is cut short")
        if entry["dtype"] not in DTYPES:
            raise CheckpointError(f"{self.where}: tensor {key!r} has dtype {entry['dtype']}")
        t = torch.frombuffer(data, dtype=DTYPES[entry["dtype"]]) if data else torch.empty(0)
        t = t.reshape(shape)
        check_finite({name: t}, self.where)
        return t

    def __contains__(self, name: object) -> bool:  # Mapping's default would read the tensor
        return name in self.index

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, from the file's header (no data read)."""
        f, key = self.index[name]
        shape = tuple(self._header(f)[1][key]["shape"])
        if name in self.rows:
            lo, hi = self.rows[name]
            shape = (hi - lo, *shape[1:])
        return shape

    def renamed(self, names: Mapping[str, str]) -> LazyState:
        """The same files under new names (``names``: new -> old), still unread."""
        out = LazyState(self.where, {new: self.index[old] for new, old in names.items()})
        out.rows = {new: self.rows[old] for new, old in names.items() if old in self.rows}
        out._headers = self._headers
        return out

    def split_rows(self, name: str, parts: Mapping[str, tuple[int, int]]) -> LazyState:
        """The same files with tensor ``name`` replaced by ``parts`` (new name -> its rows [a, b)
        of ``name``, whose offset is added to any ``name`` already has), still unread."""
        keep = {k: k for k in self.index if k != name}
        out = self.renamed(keep)
        base = self.rows.get(name, (0, 0))[0]
        for new, (lo, hi) in parts.items():
            out.index[new] = self.index[name]
            out.rows[new] = (base + lo, base + hi)
        return out


def shape_of(state: Mapping[str, torch.Tensor], name: str) -> tuple[int, ...]:
    """A tensor's shape without reading it where the state is lazy."""
    return state.shape(name) if isinstance(state, LazyState) else tuple(state[name].shape)
