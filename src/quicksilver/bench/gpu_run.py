"""The prepared GPU run: everything a borrowed GPU should measure, in at most ``--budget`` seconds.

``python -m quicksilver.bench.gpu_run --out DIR`` runs, each stage in its own process with what is
left of the budget as its timeout (a stage that runs over is cut and recorded, the next one runs):

1. ``bench families`` at the LLaDA-8B shape, then at the Dream-7B shape (random bf16 weights):
   forward passes per second, then the real decoder at batch 1, 8, 16 and 32, forced 1 and 5 tokens
   per step and the family's default decoding, in the automatic attention layout (flex over the
   paged KV pool on a GPU; a failure is recorded as a row, the others stand); every decode row
   has tok/s per request and aggregate and its peak memory;
2. DiffusionGemma-26B-A4B (~52 GB of random bf16 weights) at batch 1 and 4: vLLM's published
   setting (canvas 256, 16 denoising steps) and the family's default decoding, with each row's peak
   memory (bench/gemma_shape.py; running out of memory is a row too);
3. the LLaDA-8B shape in FP8 (``--quantize fp8``, runtime/fp8.py) at batch 1 and 8, 5 tokens per
   step (recorded as refused on a GPU without FP8 tensor cores); then at batch 1, 5 tokens per
   step, eager and with CUDA graphs (``--cuda-graphs``: whole captured steps, a stage of its own
   because compiling an 8B step may take minutes);
4. with ``--idlm DIR`` only (a local I-DLM checkpoint, models/families/idlm.py): greedy verify
   decoding of one chat prompt at draft 0 (plain AR, the baseline) and at the model's draft length
   on the same loaded weights: tok/s, NFE, TPF and whether the two outputs agree. Without the flag
   the stage is not planned at all;
5. ``bench speed`` on the shipped model on the GPU in bf16 (4 items per task, 3 repeats, single
   stream): its verify decoding against its AR twin (``ratio_vs_ar``), with ``SPEED_RESERVE``
   seconds kept for it.

The first line printed and ``DIR/gpu_run.json`` name the device. ``--tiny`` runs toy shapes and one
item on the CPU in about a minute (the test of this script).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ..pipeline import load
from ..sampling.decoders.verify import VerifyDecoder
from .gemma_shape import SHAPE as GEMMA_SHAPE


def device_name() -> str:
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda})"
    return f"CPU {platform.processor() or platform.machine()} (no GPU)"


SPEED_RESERVE = 100.0  # seconds kept for the last stage, bench speed
Stage = tuple[str, list[str]]  # a name and the command of its own process


def family_stage(name: str, shape: str, extra: list[str], tiny: bool, out: Path) -> Stage:
    """``bench families`` at one shape: batch 1 / 8 / 16 / 32, forced 1 and 5 tokens per step and
    the default decoding, the automatic attention layout (``extra`` narrows or adds)."""
    cmd = [sys.executable, "-m", "quicksilver.bench.gpu_families", "--shapes", shape]
    cmd += ["--batch", "1", "2"] if tiny else ["--batch", "1", "8", "16", "32", "--iters", "10"]
    cmd += ["--tokens-per-step", "1", "5", "--gen", "20" if tiny else "120"]
    cmd += ["--tiny", "--block", "8", "--decode-block", "10"] if tiny else ["--dtype", "bfloat16"]
    return name, cmd + extra + ["--out", str(out / f"{name}.json")]


def stages(args: argparse.Namespace, out: Path) -> list[Stage]:
    """The run's stages in order (see the module docstring)."""
    py, tiny = [sys.executable, "-m"], args.tiny
    plan = [family_stage(shape, shape, [], tiny, out) for shape in ("llada-8b", "dream-7b")]
    gemma = [*py, "quicksilver.bench.gpu_families", "--shapes", GEMMA_SHAPE, "--batch", "1", "4"]
    gemma += ["--tiny"] if tiny else ["--dtype", "bfloat16"]
    plan.append((GEMMA_SHAPE, gemma + ["--out", str(out / f"{GEMMA_SHAPE}.json")]))
    fp8 = ["--quantize", "fp8", "--batch", "1", "8", "--tokens-per-step", "5"]
    plan.append(family_stage("llada-8b-fp8", "llada-8b", fp8, tiny, out))
    # last but speed: compiling a whole 8B step may take minutes, and a cut stage keeps nothing
    graphs = ["--batch", "1", "--tokens-per-step", "5", "--cuda-graphs"]
    plan.append(family_stage("llada-8b-graphs", "llada-8b", graphs, tiny, out))
    if getattr(args, "idlm", None):
        cmd = [*py, "quicksilver.bench.gpu_run", "--idlm-stage", str(args.idlm)]
        plan.append(("idlm", cmd + ["--out", str(out)] + (["--tiny"] if tiny else [])))
    speed = [*py, "quicksilver.cli", "bench", "speed", "--skip-reference"]
    speed += ["--limit", "1", "--repeats", "1", "--tasks", "multiply"] if tiny else []
    speed += [] if tiny else ["--limit", "4", "--repeats", "3"]
    if torch.cuda.is_available() and not tiny:
        speed += ["--device", "cuda", "--dtype", "bfloat16"]
    return [*plan, ("speed", speed + ["--out", str(out / "speed")])]


IDLM_PROMPT = "Prove that sqrt(2) is irrational."  # the example prompt of I-DLM's README


def idlm_stage(path: str, out: Path, tiny: bool) -> int:
    """Greedy verify decoding of a local I-DLM checkpoint at draft 0 (AR) and at its draft length,
    one loaded model, one chat prompt; prints (and writes ``out/idlm.json``) one JSON line."""
    pipe = load(path)
    if not isinstance(pipe.decoder, VerifyDecoder):  # e.g. a directory that says SDARForCausalLM
        cfg = pipe.config
        print(f"{path}: loads as {cfg.architecture} ({cfg.attention}), not as an I-DLM (a causal")
        print("model for verify decoding; see quicksilver/models/families/idlm.py)", flush=True)
        return 2
    k, n = pipe.config.draft_length, 32 if tiny else 256
    rows, tokens = [], []
    for draft in (0, k):
        opts = dict(temperature=0.0, draft=draft, stop_at_eos=False)
        pipe.generate(IDLM_PROMPT, chat=True, max_new_tokens=8, **opts)  # warm-up
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        res = pipe.generate(IDLM_PROMPT, chat=True, max_new_tokens=n, **opts)
        tokens.append(res.tokens)
        rows.append(
            {
                "draft": draft,
                "tokens": len(res.tokens),
                "nfe": res.nfe,
                "tpf": round(res.tpf, 3),
                "seconds": round(res.seconds, 3),
                "tok_s": round(len(res.tokens) / max(res.seconds, 1e-9), 1),
            }
        )
    summary = {
        "bench": "idlm",
        "model": str(path),
        "device": device_name(),
        "dtype": str(next(pipe.model.parameters()).dtype),
        "draft_length": k,
        "rows": rows,
        "greedy_equal": tokens[0] == tokens[1],
        "speedup_vs_ar": round(rows[1]["tok_s"] / max(rows[0]["tok_s"], 1e-9), 3),
    }
    line = json.dumps(summary)
    out.mkdir(parents=True, exist_ok=True)
    (out / "idlm.json").write_text(line + "\n")
    print(line)
    return 0


def timeout_for(stage: int, n_stages: int, left: float) -> float:
    """The families stages share what is left after the speed reserve; the last gets the rest."""
    if stage == n_stages - 1:
        return left
    return max(10.0, (left - SPEED_RESERVE) / (n_stages - 1 - stage))


def run_stage(name: str, cmd: list[str], timeout: float, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    log = out / f"{name}.log"
    with log.open("w") as f:
        try:
            rc: int | str = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    lines = log.read_text().strip().splitlines()
    last = lines[-1] if lines else ""
    result = json.loads(last) if rc == 0 and last.startswith("{") else None
    return {
        "stage": name,
        "rc": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "result": result,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m quicksilver.bench.gpu_run", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", default="runs/gpu_run", help="directory for the logs and JSON")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for all stages together")
    p.add_argument("--tiny", action="store_true", help="toy shapes on the CPU (tests the script)")
    p.add_argument("--idlm", metavar="DIR", help="also run the I-DLM stage on this checkpoint")
    p.add_argument("--idlm-stage", metavar="DIR", dest="idlm_stage", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.idlm_stage:  # the stage's own process (planned by --idlm)
        return idlm_stage(args.idlm_stage, Path(args.out), args.tiny)
    if args.idlm and not Path(args.idlm).is_dir():
        p.error(f"--idlm {args.idlm}: not a directory")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = device_name()
    print(f"quicksilver gpu_run on {name}, torch {torch.__version__}", flush=True)
    t0 = time.perf_counter()
    done = []
    plan = stages(args, out)
    for i, (stage, cmd) in enumerate(plan):
        left = args.budget - (time.perf_counter() - t0)
        if left < 10:
            done.append(
                {"stage": stage, "rc": "skipped: budget spent", "seconds": 0, "result": None}
            )
            continue
        done.append(run_stage(stage, cmd, timeout_for(i, len(plan), left), out))
        print(f"  {stage}: rc {done[-1]['rc']} in {done[-1]['seconds']} s", flush=True)
    summary = {"bench": "gpu_run", "device": name, "torch": torch.__version__, "stages": done}
    line = json.dumps(summary)
    (out / "gpu_run.json").write_text(line + "\n")
    print(line)
    return 0 if all(d["rc"] == 0 for d in done) else 1


if __name__ == "__main__":
    sys.exit(main())
