"""llama.cpp's ``llama-diffusion-cli`` beside ``bench shapes`` on the LLaDA-8B slice: the same
random weights as a GGUF of llama.cpp's ``llada`` architecture, quantized per format by
``llama-quantize``, and one block of generated positions timed step by step.

Why the GGUF is written here by hand: llama.cpp's converter (``convert_hf_to_gguf.py``,
``conversion/llada.py``) loads LLaDA's tokenizer through ``transformers`` and accepts only
pre-tokenizers it knows by a hash of their output, so it needs the real checkpoint's tokenizer
files; a random-weight shape has none. This module writes what its ``llada`` loader reads
(``src/models/llada.cpp``): llama's tensor names (token_embd, blk.N.attn_norm / attn_q / attn_k /
attn_v / attn_output / ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output), q/k rows
reordered to adjacent pairs (llada rotates pairs, our weights halves; the converter's
``undo_permute``), non-causal attention, ``diffusion.shift_logits`` false, and a placeholder
vocabulary of the right size (the byte alphabet, then unused entries) with LLaDA's mask token at
its id (``tokenizer.ggml.mask_token_id``, which the CLI asserts). A chat template that returns the
user's text as is and no BOS make a prompt of P letters exactly P tokens.

What one step computes differs, and both figures say so: llama.cpp's LLaDA has no KV cache, so
each step runs the whole canvas (prompt + generated block, every position's logits) and then
samples; our block step runs only the block's positions against the prompt's cache. The CLI's
canvas is ``-ub`` positions; ``--diffusion-block-length`` set to the whole canvas makes the prompt
one block and the generated positions the only masked block (the CLI counts its blocks from
position 0). Weight repacking is off (``--no-repack``: this build crashes on repacked Q4_0 / Q8_0
with AMX; docs/LOG.md, 2026-12-07); the CLI as released drops that flag, and ``make llama-server``
builds it with the one line that passes it through.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
from pathlib import Path
from typing import Any

from ..errors import QuicksilverError
from ..models.config import ModelConfig
from ..models.gguf_export import LAYER_NAMES, add_body
from ..runtime.ov_graph import Weights
from .llama_shapes import add_weights, byte_alphabet, finish, llama_tool, quantize_gguf, run_watched

ARCH = "llada"
MASK_TOKEN = "<|mdm_mask|>"
PROMPT_LETTER = "a"  # one token each under the placeholder vocabulary (no merges apply)
ECHO_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
DIFFUSION_SHAPES = ("llada-8b-slice",)  # the shapes llama-diffusion-cli runs beside ours
STEPS = 4  # steps of the timed block (a step's cost does not depend on how many there are)
STEP_RE = re.compile(r"time per step: ([\d.]+) ?ms, sampling time per step: ([\d.]+) ?ms")


def llada_vocab(cfg: ModelConfig) -> tuple[list[str], list[int]]:
    """The placeholder vocabulary: 256 byte tokens, unused entries, LLaDA's mask token (control)."""
    n = cfg.vocab_size
    mask = cfg.mask_token_id
    if mask is None or not 256 <= mask < n:
        raise QuicksilverError("the llada GGUF needs a mask token id past the 256 byte tokens")
    tokens = byte_alphabet() + [f"<unused{i}>" for i in range(256, n)]
    types = [1] * 256 + [5] * (n - 256)  # normal, unused
    tokens[mask], types[mask] = MASK_TOKEN, 3  # control
    return tokens, types


def write_llada_gguf(cfg: ModelConfig, weights: Weights, path: Path) -> Path:
    """The network ``weights`` reads as a bf16 GGUF of llama.cpp's ``llada`` architecture."""
    import gguf  # lazy: only this bench writes shapes

    if cfg.attention != "bidirectional" or cfg.logit_shift or cfg.qk_norm or cfg.moe is not None:
        raise QuicksilverError("the llada GGUF covers LLaDA's dense bidirectional body")
    w = gguf.GGUFWriter(str(path), ARCH, use_temp_file=True)
    add_body(w, cfg)
    w.add_rope_dimension_count(cfg.dim_head)
    w.add_causal_attention(False)
    w.add_diffusion_shift_logits(False)
    tokens, types = llada_vocab(cfg)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{tokens[71]} {tokens[72]}"])
    w.add_mask_token_id(cfg.mask_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(ECHO_TEMPLATE)
    add_weights(w, cfg, weights, LAYER_NAMES, pairs=True)
    return finish(w, path)


def diffusion_cli(
    gguf_path: Path, prompt: int, generated: int, steps: int, threads: int
) -> dict[str, Any]:
    """One ``llama-diffusion-cli`` run: a prompt of ``prompt`` tokens and one block of
    ``generated`` masked positions in ``steps`` steps. Its own clock's ms a step (sampling
    included, and without it) and the run's peak RSS."""
    canvas = prompt + generated
    cmd = [
        str(llama_tool("llama-diffusion-cli")), "-m", str(gguf_path), "-p", PROMPT_LETTER * prompt,
        "-c", str(canvas), "-b", str(canvas), "-ub", str(canvas), "-n", str(generated),
        "--diffusion-steps", str(steps), "--diffusion-block-length", str(canvas),
        "-t", str(threads), "-tb", str(threads), "--temp", "0", "--seed", "0", "--no-repack",
    ]  # fmt: skip
    for _ in range(5):  # its leaked logger may lose the last lines at exit (#22142): rerun
        code, out, err, peak = run_watched(cmd)
        found = STEP_RE.search(out + err)
        if code != 0 or found is not None:
            break
    if code != 0 or found is None:
        hint = (
            " (a build that drops --no-repack crashes on AMX: make llama-server)"
            if code < 0
            else ""
        )
        raise QuicksilverError(f"llama-diffusion-cli failed ({code}){hint}: {err.strip()[-300:]}")
    step, sampling = float(found[1]), float(found[2])
    return {"step_ms": step, "forward_ms": step - sampling, "peak_rss_bytes": peak}


class LlamaDiffusionPeer:
    """llama-diffusion-cli on the same shape: one bf16 ``llada`` GGUF of the same random weights,
    quantized per format on first use, its step timed over a prompt of ``--context`` tokens and
    one block of the largest window's positions, ``--llama-reps`` runs (medians)."""

    key = "llama_diffusion"  # where a format's row keeps its figures

    def __init__(self, cfg: ModelConfig, weights: Weights, args: argparse.Namespace) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="qs-llada-gguf-")
        self.args, self.files = args, {}
        self.files["BF16"] = write_llada_gguf(cfg, weights, Path(self.dir.name) / "bf16.gguf")

    def bench(self, kind: str, ours: dict[str, Any]) -> dict[str, Any]:
        """llama-diffusion-cli's step in ``kind``, and our block step's ratio to it."""
        if kind not in self.files:
            out = Path(self.dir.name) / f"{kind.lower()}.gguf"
            self.files[kind] = quantize_gguf(self.files["BF16"], kind, out)
        a = self.args
        block = max(a.windows)
        runs = [
            diffusion_cli(self.files[kind], a.context, block, STEPS, a.threads or 1)
            for _ in range(a.llama_reps)
        ]
        step = statistics.median(r["step_ms"] for r in runs)
        forward = statistics.median(r["forward_ms"] for r in runs)
        mine = ours["step_ms"][str(block)]
        return {
            "type": kind,
            "tool": "llama-diffusion-cli",
            "prompt": a.context,
            "generated": block,
            "canvas": a.context + block,
            "steps": STEPS,
            "step_ms": round(step, 3),
            "forward_ms": round(forward, 3),
            "runs_step_ms": [r["step_ms"] for r in runs],
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
            "repack": False,
            "block_ours_vs_theirs": round(mine / forward, 3),
            "block_ours_vs_theirs_with_sampling": round(mine / step, 3),
        }

    def close(self) -> None:
        self.dir.cleanup()


def diffusion_thesis(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per LLaDA shape and format beside llama-diffusion-cli: our block step over its step (its
    forward alone, the stricter; ``_with_sampling``: its whole step)."""
    out: dict[str, Any] = {}
    for shape in results:
        rows = [r for r in shape["formats"] if "llama_diffusion" in r]
        if rows:
            out[shape["shape"]] = {
                f"block_{r['format']}_vs_llama_{r['llama_diffusion']['type']}": r[
                    "llama_diffusion"
                ]["block_ours_vs_theirs"]
                for r in rows
            }
    return out


def plot_peer(ax: Any, peer: dict[str, Any], color: Any) -> None:
    """llama-diffusion-cli's step as one star at the block's positions on the ms-a-step axes."""
    ax.plot(
        [peer["generated"]],
        [peer["forward_ms"]],
        "*",
        ms=12,
        color=color,
        label=f"llama-diffusion-cli {peer['type']} (all {peer['canvas']} positions, no cache)",
    )
