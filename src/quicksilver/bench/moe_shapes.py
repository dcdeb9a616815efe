"""The mixture-of-experts families at their published sizes with RANDOM weights, written as the HF
checkpoints they ship as: ``python -m quicksilver.bench.moe_shapes write SHAPE DIR``.

Shapes: ``llada2-mini`` (LLaDA2.0/2.1-mini, 16B total / 1.4B active: hidden 2048, 20 layers, the
first dense, 256 experts of 512 with top-8 in 8 groups, a shared expert, vocabulary 157,184, untied
head; the published config.json as reproduced in reference/model_formats.md §3.2, weight names of
its remote code: fused ``attention.query_key_value``, ``mlp.experts.{e}.{gate,up,down}_proj``) and
``diffusiongemma-26b-a4b`` (bench/gemma_shape.py's text config: 26B total / 4B active, 128 experts of
704 with top-8 beside a dense MLP, vocabulary 262,144, tied; the names ``save_pretrained`` writes,
``model.decoder.*`` plus the encoder's ``layer_scalar`` buffers). ``--layers N`` keeps the first N.

The files are sharded bf16 safetensors (``model-0000i-of-0000n.safetensors`` and the index), written
shard by shard without holding a tensor: each weight is a cheap repeated block of N(0, 0.02) values
(a block of a prime length, so rows and experts differ), norm and router scales 1, expert biases 0,
so writing runs at the disk's speed and memory stays flat. The tokenizer is the shipped model's (its
vocabulary is smaller than the network's, which a loader allows): these checkpoints measure memory
and speed of a load and a served reply, never quality. Never commit them: 32 GB and 52 GB.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..assets import embedded_diffusion_model_path
from ..errors import ConfigError
from ..models.config import ModelConfig
from ..models.families.diffusion_gemma import DECODER, ENCODER, gemma_config
from ..models.families.diffusion_gemma_net import DiffusionGemmaLM, GemmaKVCache, expected_names
from ..models.families.llada_moe import llada2_config
from ..models.meta import meta_build
from ..runtime.weight_only import load_quantized
from .common import current_rss_bytes, hardware, peak_rss_bytes, time_ms
from .gemma_shape import shape_config as gemma_shape_config

LLADA2_MINI: dict[str, Any] = {
    "architectures": ["LLaDA2MoeModelLM"],
    "model_type": "llada2_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 20,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.5,
    "score_function": "sigmoid",
    "norm_topk_prob": True,
    "moe_router_enable_expert_bias": True,
    "use_qk_norm": True,
    "use_qkv_bias": False,
    "use_bias": False,
    "partial_rotary_factor": 0.5,
    "rope_theta": 600000.0,
    "rms_norm_eps": 1e-06,
    "max_position_embeddings": 32768,
    "vocab_size": 157184,
    "pad_token_id": 156892,
    "eos_token_id": 156892,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
SHAPES = ("llada2-mini", "diffusiongemma-26b-a4b")
BLOCK = 1_000_003  # elements of the repeated random block (prime)
SHARD_BYTES = 4 << 30
Layout = list[tuple[str, tuple[int, ...]]]  # (name in the file, shape), in writing order


def _swiglu(p: str, C: int, F: int) -> Layout:
    return [
        (f"{p}.gate_proj.weight", (F, C)),
        (f"{p}.up_proj.weight", (F, C)),
        (f"{p}.down_proj.weight", (C, F)),
    ]


def llada2_layout(cj: dict[str, Any]) -> Layout:
    """LLaDA2's tensors in its remote code's names (reference/model_formats.md §3.2)."""
    C, H, KV, hd = (
        cj["hidden_size"],
        cj["num_attention_heads"],
        cj["num_key_value_heads"],
        cj["head_dim"],
    )
    E, FE = cj["num_experts"], cj["moe_intermediate_size"]
    out: Layout = [("model.word_embeddings.weight", (cj["vocab_size"], C))]
    for i in range(cj["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [
            (f"{p}.input_layernorm.weight", (C,)),
            (f"{p}.post_attention_layernorm.weight", (C,)),
            (f"{p}.attention.query_key_value.weight", ((H + 2 * KV) * hd, C)),
            (f"{p}.attention.dense.weight", (C, H * hd)),
            (f"{p}.attention.query_layernorm.weight", (hd,)),
            (f"{p}.attention.key_layernorm.weight", (hd,)),
        ]
        if i < cj["first_k_dense_replace"]:
            out += _swiglu(f"{p}.mlp", C, cj["intermediate_size"])
            continue
        out += [(f"{p}.mlp.gate.weight", (E, C)), (f"{p}.mlp.gate.expert_bias", (E,))]
        for e in range(E):
            out += _swiglu(f"{p}.mlp.experts.{e}", C, FE)
        out += _swiglu(f"{p}.mlp.shared_experts", C, FE * cj["num_shared_experts"])
    return out + [("model.norm.weight", (C,)), ("lm_head.weight", (cj["vocab_size"], C))]


def gemma_layout(cj: dict[str, Any]) -> Layout:
    """DiffusionGemma's text tensors in the names ``save_pretrained`` writes, layer by layer."""
    shapes = expected_names(gemma_config(Path("<config.json>"), cj))

    def file_name(ours: str) -> str:
        if ours.endswith("encoder_layer_scalar"):
            return ENCODER + ours.replace("encoder_layer_scalar", "layer_scalar")
        return DECODER + ours

    def layer(ours: str) -> int:
        parts = ours.split(".")
        return int(parts[1]) if parts[0] == "layers" else -1

    return [(file_name(k), s) for k, s in sorted(shapes.items(), key=lambda kv: layer(kv[0]))]


def shape_checkpoint(name: str, layers: int | None) -> tuple[dict[str, Any], Layout]:
    """config.json and the tensors of shape ``name`` (``layers``: the first N only)."""
    if name == "llada2-mini":
        cj = {**LLADA2_MINI, "num_hidden_layers": layers or LLADA2_MINI["num_hidden_layers"]}
        return cj, llada2_layout(cj)
    if name == "diffusiongemma-26b-a4b":
        cj = {**gemma_shape_config(False, layers), "model_type": "diffusion_gemma"}
        cj["text_config"]["tie_word_embeddings"] = True
        return cj, gemma_layout(cj)
    raise ConfigError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")


def fill_value(name: str) -> float | None:
    """The constant of a tensor that is not random: norm and router scales 1, biases 0."""
    if name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
        return 1.0
    if name.endswith("expert_bias"):
        return 0.0
    return None


def shards(layout: Layout, limit: int = SHARD_BYTES) -> Iterator[Layout]:
    """The layout cut into runs of at most ``limit`` bf16 bytes (a bigger tensor alone)."""
    run: Layout = []
    size = 0
    for name, shape in layout:
        n = 2 * math.prod(shape)
        if run and size + n > limit:
            yield run
            run, size = [], 0
        run.append((name, shape))
        size += n
    if run:
        yield run


def write_shard(f: Path, tensors: Layout, block: torch.Tensor) -> None:
    """One bf16 safetensors file of ``tensors``, each written from ``block`` repeated."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, shape in tensors:
        n = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    data = block.view(torch.int16).numpy().tobytes()
    consts: dict[float, bytes] = {}
    with f.open("wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for name, shape in tensors:
            left = 2 * math.prod(shape)
            value = fill_value(name)
            if value is not None and value not in consts:
                const = torch.full((BLOCK,), value, dtype=torch.bfloat16)  # (BLOCK,)
                consts[value] = const.view(torch.int16).numpy().tobytes()
            chunk = data if value is None else consts[value]
            while left:
                out.write(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))


def write_checkpoint(name: str, out: Path, layers: int | None = None, seed: int = 0) -> Path:
    """The checkpoint directory of shape ``name`` (see the module docstring)."""
    cj, layout = shape_checkpoint(name, layers)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    block = (torch.randn(BLOCK, generator=gen) * 0.02).to(torch.bfloat16)  # (BLOCK,)
    runs = list(shards(layout))
    weight_map: dict[str, str] = {}
    for i, run in enumerate(runs):
        fname = f"model-{i + 1:05d}-of-{len(runs):05d}.safetensors"
        write_shard(out / fname, run, block)
        weight_map.update({n: fname for n, _ in run})
    total = sum(2 * math.prod(s) for _, s in layout)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out / "config.json").write_text(json.dumps(cj, indent=2))
    shipped = embedded_diffusion_model_path()
    assert shipped is not None
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(shipped / f, out / f)
    return out


class DrawnState(Mapping[str, torch.Tensor]):
    """A network's tensors drawn when asked for (bench/shapes.py's ``random_weights``): what a
    lazily read checkpoint gives a quantized load, without the files."""

    def __init__(self, names: list[str], draw: Callable[[str], torch.Tensor]) -> None:
        self.names, self.draw = names, draw

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        return self.draw(name)

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def llada2_shape_config(tiny: bool, layers: int | None = None) -> ModelConfig:
    """The ModelConfig a LLaDA2-mini checkpoint gets (``tiny``: toy widths for tests; ``layers``:
    the first N layers at the real widths)."""
    small = {"hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256, "head_dim": 32,
             "moe_intermediate_size": 64, "num_experts": 16, "vocab_size": 512,
             "mask_token_id": 511, "pad_token_id": 510, "eos_token_id": 510}  # fmt: skip
    cj = {**LLADA2_MINI, **(small if tiny else {})}
    if layers:
        cj["num_hidden_layers"] = layers
    return llada2_config(Path("<llada2-mini config.json>"), cj, ["mlp.gate.expert_bias"])


def drawn(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> DrawnState:
    """Random tensors of these names and shapes, drawn when read (norm and router scales 1)."""

    def draw(name: str) -> torch.Tensor:
        value = fill_value(name)
        if value is not None:
            return torch.full(shapes[name], value)
        gen = torch.Generator().manual_seed(seed + sum(map(ord, name)) * 7919 + len(name))
        return torch.randn(shapes[name], generator=gen, dtype=torch.bfloat16) * 0.02

    return DrawnState(list(shapes), draw)


@torch.no_grad()
def gemma_steps(
    fmt: str, layers: int | None, context: int, canvases: list[int], iters: int
) -> dict[str, Any]:
    """DiffusionGemma-26B-A4B (or its first ``layers``) in weight-only ``fmt`` with random weights:
    after a prompt of ``context`` tokens, the ms of one decoder pass over a canvas of each size in
    ``canvases`` (with self-conditioning logits)."""

    cj = shape_checkpoint("diffusiongemma-26b-a4b", layers)[0]
    cfg = gemma_config(Path("<config.json>"), cj)
    with meta_build():
        net = DiffusionGemmaLM(cfg)
    t0 = time.perf_counter()
    load_quantized(net, drawn(expected_names(cfg)), fmt, {})
    net.reset_rope()
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    cache = GemmaKVCache()
    net.encode(torch.randint(3, cfg.vocab_size, (1, context), generator=gen), cache)
    decode_ms: dict[str, float] = {}
    for n in canvases:
        canvas = torch.randint(0, cfg.vocab_size, (1, n), generator=gen)  # (1, n)
        sc = net.decode(canvas, cache)  # (1, n, V)
        step = partial(net.decode, canvas, cache, sc)
        decode_ms[str(n)] = round(time_ms(step, iters), 1)
    return {
        "shape": "diffusiongemma-26b-a4b",
        "format": fmt,
        "layers": cfg.n_layers,
        "build_seconds": round(build_s, 1),
        "context": context,
        "decode_ms": decode_ms,
        "rss_bytes": current_rss_bytes(),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["write", "steps"])
    p.add_argument("shape", choices=SHAPES)
    p.add_argument("out", type=Path, nargs="?", help="write: the checkpoint directory")
    p.add_argument("--layers", type=int, default=None, help="the first N layers only")
    p.add_argument("--format", default="int4", help="steps: int4 or int8")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--canvas", type=int, nargs="+", default=[8, 256])
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.action == "steps":
        if args.shape != "diffusiongemma-26b-a4b":
            raise ConfigError("steps: DiffusionGemma only (LLaDA2-mini: bench shapes)")
        res = gemma_steps(args.format, args.layers, args.context, args.canvas, args.iters)
        print(json.dumps({**res, "hardware": hardware()}))
        return 0
    path = write_checkpoint(args.shape, args.out, args.layers)
    size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    print(json.dumps({"shape": args.shape, "path": str(path), "bytes": size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
