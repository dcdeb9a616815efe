"""Weight integrity: a corrupted, truncated or padded safetensors file, NaN weights and a checksum
mismatch all fail at load with a one-line reason; ``save`` writes ``model.sha256``; the serve CLI's
``--verify-checksum`` refuses modified weights (issue 14)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from quicksilver.errors import CheckpointError
from quicksilver.models.checkpoint import load_checkpoint
from quicksilver.models.init import init_model
from quicksilver.models.integrity import verify_checksums


@pytest.fixture()
def ckpt(tmp_path: Path) -> Path:
    return init_model(tmp_path / "tiny", "tiny", seed=0)


def data_start(f: Path) -> int:
    (n,) = struct.unpack("<Q", f.read_bytes()[:8])
    return 8 + n


def test_save_writes_a_checksum_that_verifies(ckpt: Path) -> None:
    line = (ckpt / "model.sha256").read_text().split()
    assert line[1] == "model.safetensors" and len(line[0]) == 64
    verify_checksums(ckpt)
    load_checkpoint(ckpt)


def test_nan_weights_are_refused_at_load(ckpt: Path) -> None:
    f = ckpt / "model.safetensors"
    raw = bytearray(f.read_bytes())
    header = json.loads(raw[8 : data_start(f)])
    name, t = next((k, v) for k, v in header.items() if k != "__metadata__")
    at = data_start(f) + t["data_offsets"][0]
    raw[at : at + 4] = struct.pack("<f", float("nan"))  # float32 weights
    f.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        verify_checksums(ckpt)


@pytest.mark.parametrize("damage", ["truncate", "pad", "header"])
def test_a_damaged_file_is_refused_with_its_reason(ckpt: Path, damage: str) -> None:
    f = ckpt / "model.safetensors"
    raw = f.read_bytes()
    if damage == "truncate":
        raw = raw[:-100]
    elif damage == "pad":
        raw = raw + b"\0" * 64
    else:
        raw = struct.pack("<Q", 10**12) + raw[8:]
    f.write_bytes(raw)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(ckpt)


def test_serve_verify_checksum_refuses_modified_weights(ckpt: Path) -> None:
    f = ckpt / "model.safetensors"
    raw = bytearray(f.read_bytes())
    raw[-1] ^= 1  # one flipped bit in the last weight: still finite, still loads
    f.write_bytes(bytes(raw))
    load_checkpoint(ckpt)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quicksilver.cli",
            "serve",
            "--model",
            str(ckpt),
            "--verify-checksum",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "checksum mismatch" in out.stderr
    assert "Traceback" not in out.stderr
