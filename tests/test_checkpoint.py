"""Checkpoint directories: bit-exact round trip, dtype, the loader registry, clear errors, no network."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
import torch

import quicksilver
from quicksilver.errors import CheckpointError
from quicksilver.models.checkpoint import (
    BF16_CPU_PARAMS,
    default_dtype,
    load_checkpoint,
    save_checkpoint,
)


def test_round_trip_is_bit_exact(tiny_ckpt: Path, tmp_path: Path) -> None:
    pipe = quicksilver.load(tiny_ckpt)
    out = save_checkpoint(pipe.model, pipe.tokenizer, tmp_path / "copy")
    again = quicksilver.load(out)
    a, b = pipe.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.config == pipe.config
    assert json.loads((out / "config.json").read_text())["architectures"] == [
        "QuicksilverForDiffusionLM"
    ]
    for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / f).is_file()
    tc = json.loads((out / "tokenizer_config.json").read_text())
    assert tc["mask_token"] == "<|mask|>" and tc["eos_token"] and tc["chat_template"]
    x = torch.randint(16, 200, (1, 9))
    assert torch.equal(pipe.model(x), again.model(x))


def test_bf16_checkpoint_round_trips_its_values(tiny_ckpt: Path, tmp_path: Path) -> None:
    pipe = quicksilver.load(tiny_ckpt)
    out = save_checkpoint(pipe.model, pipe.tokenizer, tmp_path / "bf16", dtype="bfloat16")
    again = quicksilver.load(out)
    for k, v in pipe.model.state_dict().items():
        assert torch.equal(again.model.state_dict()[k], v.to(torch.bfloat16).float())
    assert (out / "model.safetensors").stat().st_size < (
        tiny_ckpt / "model.safetensors"
    ).stat().st_size * 0.6


def test_tied_embeddings_round_trip(tmp_path: Path) -> None:
    from quicksilver.models.init import init_model

    p = quicksilver.load(init_model(tmp_path / "tied", "tiny", tie_embeddings=True))
    assert p.model.lm_head.weight.data_ptr() == p.model.model.embed_tokens.weight.data_ptr()


def _broken(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_errors_are_checkpoint_errors(tiny_ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        quicksilver.load(tmp_path / "missing")
    d = _broken(tiny_ckpt, tmp_path / "noconfig")
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing config.json"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "badjson")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "arch")
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["MysteryLM"]}))
    with pytest.raises(CheckpointError, match="unsupported architecture"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "shape")
    (d / "config.json").write_text(json.dumps({**cfg, "d_model": 128}))
    with pytest.raises(CheckpointError, match="shape"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "badweights")
    (d / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="unreadable"):
        quicksilver.load(d)
    d = _broken(tiny_ckpt, tmp_path / "notok")
    (d / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        quicksilver.load(d)
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(CheckpointError, match="directory"):
        quicksilver.load(f)


def test_loading_never_touches_the_network(
    tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("network access during load")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    model, tok = load_checkpoint(tiny_ckpt)
    assert tok.mask_id == model.config.mask_token_id


def test_default_dtype_follows_the_device_and_the_model_size(tiny_ckpt: Path) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_dtype(BF16_CPU_PARAMS - 1, cpu) == torch.float32
    assert default_dtype(BF16_CPU_PARAMS, cpu) == torch.bfloat16  # measured faster from 0.5B
    assert default_dtype(1, cuda) == torch.bfloat16
    model, _ = load_checkpoint(tiny_ckpt, device="cpu")  # a small model: float32 by default
    assert model.model.embed_tokens.weight.dtype == torch.float32
    explicit, _ = load_checkpoint(tiny_ckpt, torch.bfloat16, device="cpu")
    assert explicit.model.embed_tokens.weight.dtype == torch.bfloat16
