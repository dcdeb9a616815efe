"""``quicksilver serve --tensor-parallel N``: one model split over N processes (one per GPU).

``serve_tensor_parallel`` spawns N ranks. Each joins a ``torch.distributed`` group (NCCL on CUDA,
gloo on CPU), loads the checkpoint, shards it (``models/tensor_parallel.py``) and builds its engine.
Rank 0 serves HTTP with a ``LockstepEngine``; the others ``follow`` it step by step
(``engine/lockstep.py``). On SIGTERM/SIGINT rank 0 drains as one process does, then releases the
followers. A SIGTERM to the launching process is passed to rank 0. The AR twin is not served under
tensor parallelism.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING

from ...engine.engine import Engine
from ...engine.lockstep import LockstepEngine, follow
from ...errors import QuicksilverError
from ...models.tensor_parallel import parallelize
from ..config import ServerConfig
from ..launch import run_server
from ..served import engine_config, load_pipeline, served_pipeline

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

WAIT = datetime.timedelta(days=30)  # followers wait for rank 0's next step however long it idles


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_rank(rank: int, world: int, port: int, cuda: bool) -> tuple[DeviceMesh, ProcessGroup, str]:
    """Join the group; returns (device mesh, gloo group for host objects, this rank's device)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=WAIT)
    if cuda:
        torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    objects = dist.new_group(backend="gloo", timeout=WAIT)
    return mesh, objects, f"cuda:{rank}" if cuda else "cpu"


def _rank_main(rank: int, cfg: ServerConfig, port: int) -> None:
    import torch.distributed as dist

    logging.basicConfig(level=cfg.log_level.upper())
    # Followers stop when rank 0 releases them, after its drain. Rank 0's server takes the signals
    # while it runs and raises them again when it has drained: then they must only return here.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN if rank else lambda *_: None)
    cuda = (cfg.device or "").startswith("cuda")
    mesh, objects, device = init_rank(rank, cfg.tensor_parallel, port, cuda)
    pipe = load_pipeline(cfg, device=device)
    parallelize(pipe.model, mesh)
    try:
        if rank == 0:
            engine: LockstepEngine = LockstepEngine(pipe.decoder, engine_config(cfg), objects)
            try:
                note = f" (tensor parallel over {cfg.tensor_parallel} ranks)"
                run_server(cfg, served_pipeline(cfg, pipe, engine), [], note)
            finally:
                engine.close()
        else:
            follow(Engine(pipe.decoder, engine_config(cfg)), objects)
    finally:
        dist.destroy_process_group()


def serve_tensor_parallel(cfg: ServerConfig) -> int:
    """Spawn the ranks and wait for them (rank 0 returns when the server has drained)."""
    import torch.multiprocessing as mp

    if cfg.mock:
        raise QuicksilverError("--tensor-parallel needs a model (not --mock)")
    ctx = mp.spawn(_rank_main, args=(cfg, _free_port()), nprocs=cfg.tensor_parallel, join=False)
    leader = ctx.processes[0].pid
    assert leader is not None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches rank 0 itself
    signal.signal(signal.SIGTERM, lambda *_: os.kill(leader, signal.SIGTERM))  # rank 0 drains
    try:
        while not ctx.join():
            pass
    except mp.ProcessExitedException as e:
        raise QuicksilverError(f"tensor-parallel rank {e.error_index} died ({e})") from None
    return 0
