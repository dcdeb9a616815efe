"""Shared fixtures: tiny random checkpoints in the real on-disk format."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

# one torch thread per xdist worker (`make test` runs two), two when run alone
torch.set_num_threads(
    1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads()))
)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quicksilver.models.init import init_model

    return init_model(tmp_path_factory.mktemp("ckpt") / "tiny-bidir", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_block_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from quicksilver.models.init import init_model

    return init_model(
        tmp_path_factory.mktemp("ckpt") / "tiny-block",
        "tiny",
        seed=1,
        attention="block_causal",
        block_size=8,
    )


@pytest.fixture(scope="session")
def tiny_causal_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A causal model: decoded by the verify decoder (random drafts: its AR output, slowly)."""
    from quicksilver.models.init import init_model

    return init_model(
        tmp_path_factory.mktemp("ckpt") / "tiny-causal", "tiny", seed=2, attention="causal"
    )


@pytest.fixture(scope="session")
def tiny_pipe(tiny_ckpt: Path):  # type: ignore[no-untyped-def]
    import quicksilver

    return quicksilver.load(tiny_ckpt)


@pytest.fixture(scope="session", autouse=True)
def _no_warmup() -> Iterator[None]:
    """Servers built in-process skip compiling their exported step's shapes ahead of time (seconds
    a start); ``ExportedStep.warm`` is tested on its own and servers launched as processes run it."""
    from quicksilver.pipeline import Pipeline

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Pipeline, "warm_up", lambda self: 0)
        yield
