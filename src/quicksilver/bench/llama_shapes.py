"""llama.cpp beside ``bench shapes``: the same random-weight shape as a GGUF file, its formats made
by ``llama-quantize`` and timed by ``llama-bench`` (all built by ``make llama-server``).

The GGUF is written here with the ``gguf`` package (llama.cpp's own writer) in the architecture
llama.cpp runs that body with: ``qwen2`` for the Qwen2.5 body (q/k/v bias, tied head) and ``qwen3``
for the Qwen3 one (QK-norm); both rotate halves (NeoX), as our weights do, so no row reordering. The
vocabulary is a placeholder of the right size (the byte alphabet, then unused entries): llama-bench
feeds random token ids and never tokenizes text. ``llama-bench -p w -d D`` times a w-token batch
after D cached positions (our w-position step), ``-n N -d D`` the AR token; its JSON gives both. Weight repacking is off (``--repack 0``): with it,
this build segfaults on Q4_0 and Q8_0 files on a Sapphire Rapids CPU (AMX; docs/LOG.md, 2026-12-07).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..errors import QuicksilverError
from ..models.config import ModelConfig
from ..models.gguf_export import LAYER_NAMES, TOP_NAMES, add_body, neox_to_interleaved
from ..models.transformer import Transformer
from ..runtime.ov_graph import Weights

LLAMA_BIN = Path(".venv/llama.cpp/bin")  # where `make llama-server` puts llama.cpp's programs
# our weight format -> the llama.cpp type it is set beside (llama-quantize's names)
PEER_TYPES = {"graph-bf16": "BF16", "bfloat16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}
# our name inside model.layers.{i} -> GGUF name inside blk.{i}: the export's, and Qwen3's QK-norm
LAYER = {
    **LAYER_NAMES,
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def llama_tool(name: str) -> Path:
    """A llama.cpp program: from ``$QUICKSILVER_LLAMA_BIN`` (a folder) where set, else built by
    ``make llama-server``, else on PATH."""
    own = (
        [Path(os.environ["QUICKSILVER_LLAMA_BIN"])] if "QUICKSILVER_LLAMA_BIN" in os.environ else []
    )
    for path in (
        *(d / name for d in own),
        LLAMA_BIN / name,
        *(Path(p) / name for p in os.get_exec_path()),
    ):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise QuicksilverError(f"--vs-llama-cpp needs llama.cpp's {name}: run `make llama-server`")


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order (a byte-level BPE's base)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def gguf_arch(cfg: ModelConfig) -> str:
    """The llama.cpp architecture that runs this body as an AR model."""
    if cfg.moe is not None or cfg.partial_rotary_factor != 1.0 or cfg.o_bias:
        raise QuicksilverError("--vs-llama-cpp covers the dense Qwen-shaped bodies")
    return "qwen3" if cfg.qk_norm else "qwen2"


def write_gguf(cfg: ModelConfig, weights: Weights, path: Path) -> Path:
    """The network ``weights`` reads as a bf16 GGUF of its llama.cpp architecture."""
    import gguf  # lazy: only this bench writes shapes

    w = gguf.GGUFWriter(str(path), gguf_arch(cfg), use_temp_file=True)
    add_body(w, cfg)
    tokens = byte_alphabet() + [f"<unused{i}>" for i in range(256, cfg.vocab_size)]
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [5] * (cfg.vocab_size - 256))
    w.add_token_merges([f"{tokens[71]} {tokens[72]}"])
    w.add_eos_token_id(cfg.vocab_size - 2)
    add_weights(w, cfg, weights, LAYER)
    return finish(w, path)


def add_weights(
    w: Any, cfg: ModelConfig, weights: Weights, layer: dict[str, str], pairs: bool = False
) -> None:
    """The network's tensors under their GGUF names (``layer``: ours inside model.layers.{i} ->
    theirs inside blk.{i}): matrices in bf16 as drawn, norms and biases in f32 (as llama.cpp's
    converter). ``pairs``: the architecture rotates adjacent pairs (llama's RoPE), so q/k rows are
    reordered per head from our halves. One tensor in memory at a time (the writer spools them)."""
    import gguf

    names = dict(TOP_NAMES)
    for i in range(cfg.n_layers):
        names |= {f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in layer.items()}
    if cfg.tie_embeddings:
        names.pop("lm_head.weight", None)
    present = _present(cfg)
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    for ours, theirs in names.items():
        if ours not in present:
            continue
        t = weights(ours)
        kind = theirs.split(".")[-2]
        if pairs and kind in heads:
            t = neox_to_interleaved(t, heads[kind])
        if t.ndim == 2:  # the raw bf16 bytes, (rows, 2 * cols) uint8
            raw = t.to(torch.bfloat16).contiguous().view(torch.uint8).numpy()
            w.add_tensor(theirs, raw, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(theirs, t.float().numpy())


def finish(w: Any, path: Path) -> Path:
    """Write a ``gguf.GGUFWriter``'s header, metadata and spooled tensors to ``path``."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _present(cfg: ModelConfig) -> set[str]:
    """The network's parameter names (a meta network: no memory)."""
    with torch.device("meta"):
        return set(Transformer(cfg).state_dict())


def quantize_gguf(src: Path, kind: str, out: Path) -> Path:
    """``llama-quantize src out kind`` (one thread per core)."""
    if kind == "BF16":
        return src
    cmd = [str(llama_tool("llama-quantize")), str(src), str(out), kind, str(os.cpu_count() or 1)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise QuicksilverError(f"llama-quantize {kind} failed: {done.stderr.strip()[-300:]}")
    return out


def run_watched(cmd: list[str]) -> tuple[int, str, str, int]:
    """Run ``cmd``: its exit code, stdout, stderr and peak resident memory (VmHWM, read every 20 ms
    from /proc; rusage would count this process's memory, which a forked child starts with)."""
    with (
        tempfile.TemporaryFile("w+", errors="replace") as out,
        tempfile.TemporaryFile("w+", errors="replace") as err,
    ):
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
        peak = 0
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            with contextlib.suppress(OSError):
                hwm = next(
                    (ln for ln in status.read_text().splitlines() if ln.startswith("VmHWM")), ""
                )
                peak = max(peak, int(hwm.split()[1]) * 1024) if hwm else peak
            time.sleep(0.02)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), peak


def llama_bench(
    gguf_path: Path, windows: list[int], depth: int, threads: int, reps: int
) -> dict[str, Any]:
    """llama-bench's AR token and w-position batch after ``depth`` cached positions: ms each,
    and the run's peak RSS."""
    cmd = [
        str(llama_tool("llama-bench")), "-m", str(gguf_path), "-p", ",".join(map(str, windows)),
        "-n", "16", "-d", str(depth), "-t", str(threads), "-r", str(reps), "-o", "json",
        "--repack", "0",
    ]  # fmt: skip
    code, out, err, peak = run_watched(cmd)
    if code != 0:
        raise QuicksilverError(f"llama-bench failed ({code}): {err.strip()[-300:]}")
    rows = json.loads(out)
    ar = next(r for r in rows if r["n_gen"] > 0)
    steps = {str(r["n_prompt"]): r["avg_ns"] / 1e6 for r in rows if r["n_prompt"] > 0}
    return {
        "ar_token_ms": round(1e3 / ar["avg_ts"], 3),
        "step_ms": {w: round(ms, 3) for w, ms in steps.items()},
        "peak_rss_bytes": peak,
        "build": rows[0].get("build_commit"),
        "repack": False,
    }
