"""Weight-file integrity: safetensors headers checked against the file, non-finite weights refused,
and ``model.sha256`` (written by ``save_checkpoint``, checked on request with ``--verify-checksum``).

A corrupted weights file must fail at load with a one-line reason, not load and serve empty answers.
The header check is what the format promises — an 8-byte little-endian header length, a JSON header,
tensors whose byte ranges tile the data exactly to the end of the file — and costs no tensor reads;
the finite scan reads every floating tensor once (``torch.isfinite``).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path

import torch

from ..errors import CheckpointError

CHECKSUM_FILE = "model.sha256"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own bound
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
    "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip


def _bad(file: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"{file}: unreadable weights ({reason})")


def check_safetensors(file: Path) -> None:
    """Raise ``CheckpointError`` unless ``file``'s header is well-formed and matches its size."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _bad(file, f"truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _bad(file, f"header length {n} does not fit a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _bad(file, "the safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _bad(file, "the safetensors header is not a JSON object")
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            width = DTYPE_BYTES[t["dtype"]]
            begin, end = (int(x) for x in t["data_offsets"])
            count = math.prod(int(d) for d in t["shape"])
        except (KeyError, TypeError, ValueError):
            raise _bad(file, f"tensor {name!r} has a malformed header entry") from None
        if end - begin != count * width:
            raise _bad(
                file, f"tensor {name!r} spans {end - begin} bytes, its shape needs {count * width}"
            )
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise _bad(file, f"tensor {name!r} starts at {begin}, expected {at}")
        at = end
    if 8 + n + at != size:
        raise _bad(
            file,
            f"the header describes {8 + n + at} bytes but the file has {size} "
            "(truncated or padded)",
        )


def _finite_sum(t: torch.Tensor) -> bool:
    """Whether t's float32 sum is finite, summed a slab at a time (no float32 copy of t)."""
    flat = t.reshape(-1)
    return bool(sum(c.sum(dtype=torch.float32) for c in flat.split(1 << 22)).isfinite())


def check_finite(state: dict[str, torch.Tensor], where: Path) -> None:
    """Refuse weights holding NaN or infinity (a bit flip in an exponent, a diverged run)."""
    for name, t in state.items():
        if not t.is_floating_point() or _finite_sum(t):
            continue  # a finite sum has finite terms (15x cheaper on bf16 than isfinite)
        if not bool(torch.isfinite(t).all()):  # or the sum of large values overflowed
            raise CheckpointError(f"{where}: tensor {name!r} holds NaN or infinite values")


def _sha256(file: Path) -> str:
    h = hashlib.sha256()
    with file.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_checksums(path: Path) -> Path:
    """``model.sha256`` beside the weights, in ``sha256sum`` format (``sha256sum -c`` reads it)."""
    files = sorted(path.glob("*.safetensors"))
    out = path / CHECKSUM_FILE
    out.write_text("".join(f"{_sha256(f)}  {f.name}\n" for f in files))
    return out


def verify_checksums(path: Path) -> None:
    """Raise ``CheckpointError`` unless every file listed in ``model.sha256`` matches it."""
    listing = path / CHECKSUM_FILE
    if not listing.is_file():
        raise CheckpointError(f"{path}: no {CHECKSUM_FILE} to verify against")
    lines = [ln.split(None, 1) for ln in listing.read_text().splitlines() if ln.strip()]
    if not lines:
        raise CheckpointError(f"{listing}: lists no files")
    for parts in lines:
        if len(parts) != 2:
            raise CheckpointError(f"{listing}: malformed line {' '.join(parts)!r}")
        digest, name = parts[0], parts[1].strip().lstrip("*")
        f = path / name
        if Path(name).name != name or not f.is_file():
            raise CheckpointError(f"{listing}: lists {name!r}, which is not in {path}")
        if _sha256(f) != digest.lower():
            raise CheckpointError(f"{f}: checksum mismatch (corrupted or modified weights)")
