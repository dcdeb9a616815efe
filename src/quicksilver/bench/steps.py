"""``quicksilver bench steps``: ms per step of each CPU step backend, at 1 and 2 threads.

On the shipped models (or ``--model`` / ``--ar-model``): one AR token step of the AR twin, one
diffusion step of 8, 9 (a window of 8 with its predictor), 32 and 64 positions, and the verify pass
of the causal model at k = 4 and 8 (1 token + k drafts on the causal stream + k masks, the draft
block layout of sampling/decoders/verify.py) against a cache of ``--context`` committed positions, for every backend named in ``--backends`` and every thread count
in ``--threads``. Backends and thread counts are interleaved round by round (``--rounds``) and each
figure is the median over rounds of the mean over ``--repeats`` steps, so a noisy machine hurts
every candidate alike. The last line is JSON: ``ms[backend][threads][shape]``.
"""

from __future__ import annotations

import argparse
import datetime
import time
from typing import Any

import torch

from ..assets import resolve_model
from ..cli_util import add_revision_arg
from ..errors import QuicksilverError
from ..models.kvcache import KVCache
from ..pipeline import load
from ..runtime import Runtime, Segment
from ..runtime.cpu_backends import BACKEND_CHOICES, attach_backend
from .common import emit_json, hardware, median, print_table

SHAPES = {"ar_token": 1, "step_8": 8, "step_9": 9, "step_32": 32, "step_64": 64}
VERIFY = {"verify_4": 4, "verify_8": 8}  # k: a pass of 1 + 2k positions on the causal model


def _filled_cache(model: Runtime, n: int) -> KVCache:
    cache = KVCache()
    ids = torch.randint(5, model.config.vocab_size, (n,))  # (n,)
    model.forward_segments([Segment(ids, 0, n - 1, n, cache, append=n)])
    return cache


def _time_step(model: Runtime, context: int, T: int, repeats: int, draft: int = 0) -> float:
    """Mean ms of ``repeats`` passes of T new tokens after ``context`` cached ones (not appended;
    the last ``draft`` of them a draft block)."""
    cache = _filled_cache(model, context)
    ids = torch.randint(5, model.config.vocab_size, (T,))  # (T,)
    seg = Segment(ids, context, 0, T, cache, append=0, draft=draft)
    for _ in range(3):
        model.forward_segments([seg])
    t0 = time.perf_counter()
    for _ in range(repeats):
        model.forward_segments([seg])
    return 1000 * (time.perf_counter() - t0) / repeats


@torch.no_grad()
def run_steps_bench(args: argparse.Namespace) -> int:
    ar = load(resolve_model(args.ar_model, ar=True)).runtime
    dlm = load(resolve_model(args.model, which="diffusion model", revision=args.revision)).runtime
    backends = [b for b in args.backends.split(",") if b]
    threads = [int(t) for t in args.threads.split(",") if t]
    longest = max(*SHAPES.values(), *(1 + 2 * k for k in VERIFY.values()))
    if not 1 <= args.context <= min(ar.config.max_seq_len, dlm.config.max_seq_len) - longest:
        raise QuicksilverError(f"--context must leave room for a {longest}-token step")
    runners = {}
    for b in backends:  # a runtime's thread pool is fixed when it is made: one per thread count
        for n_threads in threads:
            attach_backend(ar, b, n_threads)
            attach_backend(dlm, b, n_threads)
            runners[b, n_threads] = (ar.step_backend, dlm.step_backend)
    samples: dict[tuple[str, int, str], list[float]] = {}
    for _ in range(args.rounds):
        for n_threads in threads:
            torch.set_num_threads(n_threads)
            for b in backends:
                ar.step_backend, dlm.step_backend = runners[b, n_threads]
                for shape, T in SHAPES.items():
                    model = ar if shape == "ar_token" else dlm
                    t = _time_step(model, args.context, T, args.repeats)
                    samples.setdefault((b, n_threads, shape), []).append(t)
                for shape, k in VERIFY.items():
                    t = _time_step(ar, args.context, 1 + 2 * k, args.repeats, draft=k)
                    samples.setdefault((b, n_threads, shape), []).append(t)
    ms: dict[str, Any] = {}
    for (b, n_threads, shape), xs in samples.items():
        ms.setdefault(b, {}).setdefault(str(n_threads), {})[shape] = median(xs)
    print_table(
        f"bench steps — ms per step, {args.context} cached positions, medians of {args.rounds} rounds",
        ["backend", "threads", *SHAPES, *VERIFY],
        [[b, t, *ms[b][str(t)].values()] for b in backends for t in threads],
    )
    emit_json(
        {
            "bench": "steps",
            "ms": ms,
            "context": args.context,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "hardware": hardware(),
            "date": datetime.date.today().isoformat(),
        }
    )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="diffusion checkpoint (default: the embedded diffusion model)")
    p.add_argument("--ar-model", dest="ar_model", help="AR checkpoint (default: the AR twin)")
    add_revision_arg(p)
    p.add_argument(
        "--backends",
        default="torch,onnx,openvino",
        help=f"comma-separated, from {', '.join(BACKEND_CHOICES)}",
    )
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--context", type=int, default=128, help="cached positions before the step")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=50, help="steps timed per round")
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
