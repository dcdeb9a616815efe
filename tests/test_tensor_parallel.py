"""Tensor parallelism (models/tensor_parallel.py) on CPU: two gloo processes, a dense family fixture
(LLaDA) and an MoE one (LLaDA2: sigmoid router, shared expert). TP=2 logits equal TP=1 to fp32
tolerance, through the padded path and the packed inference path with a KV cache, and a greedy
decode is token-identical on both ranks."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from family_fixtures import write_tiny

FAMILIES = ("llada", "llada2", "sdar")  # dense bidirectional, MoE, dense block-causal (KV cache)
pytestmark = pytest.mark.timeout(120)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _check(path: Path, rank: int, mesh: Any) -> dict[str, Any]:
    import quicksilver
    from quicksilver.models.tensor_parallel import parallelize
    from quicksilver.runtime.segment import Segment
    from quicksilver.sampling import SamplerConfig

    ref, tp = quicksilver.load(path), quicksilver.load(path)
    parallelize(tp.model, mesh)
    mine, full = tp.model.model.layers[0], ref.model.model.layers[0]
    experts = getattr(mine.mlp, "experts", None)
    mlp_mine = experts[0] if experts is not None else mine.mlp
    mlp_full = full.mlp.experts[0] if experts is not None else full.mlp
    halves = {  # every rank holds half of each sharded weight
        "q": (mine.self_attn.q_proj.weight.to_local(), full.self_attn.q_proj.weight, 0),
        "o": (mine.self_attn.o_proj.weight.to_local(), full.self_attn.o_proj.weight, 1),
        "up": (mlp_mine.up_proj.weight.to_local(), mlp_full.up_proj.weight, 0),
        "down": (mlp_mine.down_proj.weight.to_local(), mlp_full.down_proj.weight, 1),
    }
    for name, (local, whole, dim) in halves.items():
        assert local.shape[dim] * 2 == whole.shape[dim], name
    V = ref.config.vocab_size
    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(0))  # (B, T)
    with torch.inference_mode():
        want, got = ref.model(ids), tp.model(ids)  # (B, T, V) each
        seg = [Segment(ids[0], 0, 0, 24), Segment(ids[1, :9], 0, 2, 9)]
        packed = zip(ref.runtime.forward_segments(seg), tp.runtime.forward_segments(seg))
        packed_err = max(float((a - b).abs().max()) for a, b in packed)
    cfg = SamplerConfig(temperature=0.0, max_new_tokens=16)
    prompt = ids[0, :10].tolist()
    a, b = ref.decoder.generate([prompt], cfg)[0], tp.decoder.generate([prompt], cfg)[0]
    return {
        "err": float((want - got).abs().max()),
        "scale": float(want.abs().max()),
        "packed_err": packed_err,
        "tokens": (a.tokens, b.tokens),
    }


def _worker(rank: int, port: int, paths: dict[str, Path], out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2,))
    results = {f: _check(p, rank, mesh) for f, p in paths.items()}
    torch.save(results, out / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # two ranks in subprocesses: ~15 s (make test-slow, CI)
def test_tp2_equals_tp1_dense_and_moe(tmp_path: Path) -> None:
    paths = {f: write_tiny(f, tmp_path / f) for f in FAMILIES}
    mp.spawn(_worker, args=(_port(), paths, tmp_path), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for f in FAMILIES:
        for res in ranks:
            assert res[f]["err"] <= 1e-5 * max(1.0, res[f]["scale"]), (f, res[f]["err"])
            assert res[f]["packed_err"] <= 1e-5 * max(1.0, res[f]["scale"]), f
            single, parallel = res[f]["tokens"]
            assert single == parallel and len(single) > 0, f  # greedy decode token-identical
        assert ranks[0][f]["tokens"] == ranks[1][f]["tokens"]


def test_indivisible_shapes_are_refused(tmp_path: Path) -> None:
    import quicksilver
    from quicksilver.errors import ConfigError
    from quicksilver.models.tensor_parallel import check_divisible

    pipe = quicksilver.load(write_tiny("llada", tmp_path / "llada"))
    check_divisible(pipe.model, 2)
    with pytest.raises(ConfigError, match="does not divide n_heads=4"):
        check_divisible(pipe.model, 3)


@pytest.mark.slow  # two ranks and a server in subprocesses: ~30 s on 2 cores
def test_serve_tensor_parallel_matches_one_process(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from inprocess import serving
    from quicksilver.server import ServerConfig

    path = write_tiny("sdar", tmp_path / "sdar")
    port = _port()
    cmd = [sys.executable, "-m", "quicksilver.cli", "serve", "--model", str(path)]
    cmd += ["--tensor-parallel", "2", "--threads", "1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0} for p in ("hello", "two words")]
    try:
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.time() < deadline and proc.poll() is None, "TP server did not start"
                time.sleep(0.5)

        def ask(base: str) -> list[str]:
            with ThreadPoolExecutor(2) as pool:  # concurrent: batched steps in lockstep
                replies = pool.map(
                    lambda b: httpx.post(base + "/v1/completions", json=b, timeout=60), bodies
                )
                return [r.json()["choices"][0]["text"] for r in replies]

        parallel = ask(url)
        with serving(ServerConfig(model=str(path), threads=1)) as one:
            assert ask(one) == parallel
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
