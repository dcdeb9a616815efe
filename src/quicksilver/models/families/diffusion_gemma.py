"""DiffusionGemma (Google, 2026; ``google/diffusiongemma-26B-A4B-it``): config mapping and weights.

Facts (transformers 5.23 ``models/diffusion_gemma``, see ../shared/reference/families_2026.md):
architecture ``DiffusionGemmaForBlockDiffusion``; ``config.json`` nests the text network under
``text_config`` (``model_type`` ``diffusion_gemma_text``) beside a Gemma-4 ``vision_config`` and
``canvas_length``. Full-attention layers override ``head_dim`` and ``num_key_value_heads`` through
``per_layer_config`` (what ``save_pretrained`` writes) or, in configs written by hand,
``global_head_dim`` / ``num_global_key_value_heads``; ``rope_parameters`` per layer type;
``final_logit_softcapping`` defaults to 30 (a class attribute ``save_pretrained`` does not write).

Weights as ``save_pretrained`` writes them: the text weights once, under the decoder
(``model.decoder.{embed_tokens,layers.N.*,norm,self_conditioning.*}``: the encoder's are tied to
them and the LM head to the embeddings), plus the encoder's untied ``layer_scalar`` buffers
(``model.encoder.language_model.layers.N.layer_scalar``). A checkpoint that stores the shared
weights under the encoder's names instead is read too (the decoder's copy wins where both are).
The vision tower (``model.encoder.vision_tower.*``, ``model.encoder.embed_vision.*``) is skipped:
this is the text path. Untied checkpoints (``tie_word_embeddings: false``, separate encoder
weights) are refused.

``load_network(path)`` -> ``DiffusionGemmaLM`` (families/diffusion_gemma_net.py), registered as the
family's own network (``models.checkpoint.NETWORK_LOADERS``: ``quicksilver.load`` decodes it with
``sampling/decoders/noise_decoder.py``). Its decoding settings are the checkpoint's ``generation_config.json``
(``sampling/decoders/noise_canvas.NoiseCanvasConfig``); the family default is temperature 1, the published
schedule.

Tokenizer: ``tokenizer.json`` and ``tokenizer_config.json``; the chat template from
``tokenizer_config.json``, ``chat_template.jinja`` or a processor's ``chat_template.json``, whichever
the checkpoint has (never made up here: DiffusionGemma is a chat model, and a checkpoint without a
template is refused); ``<end_of_turn>`` stops where the vocabulary has it, beside the EOS ids of
``config.json`` and ``generation_config.json``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...errors import CheckpointError, ConfigError
from ...tokenizer import Tokenizer
from ..checkpoint import Fill, State, read_config_json, read_json_object, read_safetensors
from ..lazy_state import LazyState, shape_of
from ..meta import meta_build
from .common import Fields, with_roles
from .diffusion_gemma_net import (
    FULL,
    SLIDING,
    AttentionShape,
    DiffusionGemmaLM,
    GemmaTextConfig,
    expected_names,
)
from .registry import Family, register_family

ARCHITECTURE = "DiffusionGemmaForBlockDiffusion"
END_OF_TURN = "<end_of_turn>"
DECODER, ENCODER = "model.decoder.", "model.encoder.language_model."
VISION = ("model.encoder.vision_tower.", "model.encoder.embed_vision.")
ENCODER_SCALAR = re.compile(r"layers\.(\d+)\.layer_scalar")
PER_LAYER_KEYS = {"head_dim", "num_key_value_heads"}


def _rope(path: Path, params: Any, kind: str) -> dict[str, Any]:
    if not isinstance(params, dict) or not isinstance(params.get(kind), dict):
        raise CheckpointError(
            f"{path}/config.json: text_config.rope_parameters needs a {kind!r} entry"
        )
    r = params[kind]
    rope_type = r.get("rope_type", "default")
    prf = r.get("partial_rotary_factor")
    if rope_type == "default" and prf not in (None, 1.0):
        raise CheckpointError(
            f"{path}/config.json: {kind} rope partial_rotary_factor {prf} with rope_type default "
            "is not supported"
        )
    try:
        return dict(
            rope_theta=float(r["rope_theta"]),
            rope_type=str(rope_type),
            partial_rotary_factor=float(1.0 if prf is None else prf),
            rope_factor=float(r.get("factor", 1.0)),
        )
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"{path}/config.json: malformed {kind} rope parameters {r!r}"
        ) from None


def _full_overrides(path: Path, tc: dict, f: Fields, layer_types: list[str]) -> tuple[int, int]:
    """head_dim and KV heads of the full-attention layers (the same for every one of them)."""
    n_kv = f.int("num_key_value_heads")
    per_layer = tc.get("per_layer_config")
    if per_layer is None:  # a config written by hand, before __post_init__ resolved it
        return f.int("global_head_dim", 512), f.int("num_global_key_value_heads", n_kv)
    if not isinstance(per_layer, dict):
        raise CheckpointError(f"{path}/config.json: text_config.per_layer_config must be an object")
    seen: set[tuple[int, int]] = set()
    for key, over in per_layer.items():
        try:
            i = int(key)
        except ValueError:
            raise CheckpointError(
                f"{path}/config.json: per_layer_config key {key!r} is not a layer"
            ) from None
        if not isinstance(over, dict) or set(over) - PER_LAYER_KEYS:
            raise CheckpointError(
                f"{path}/config.json: per_layer_config[{key}] may set only {sorted(PER_LAYER_KEYS)}"
            )
        if not 0 <= i < len(layer_types) or layer_types[i] != FULL:
            raise CheckpointError(
                f"{path}/config.json: per_layer_config overrides layer {i}, not a full-attention layer"
            )
        seen.add(
            (
                int(over.get("head_dim", f.int("head_dim"))),
                int(over.get("num_key_value_heads", n_kv)),
            )
        )
    full = [i for i, t in enumerate(layer_types) if t == FULL]
    if len(seen) > 1 or (seen and len(per_layer) != len(full)):
        raise CheckpointError(
            f"{path}/config.json: full-attention layers with different shapes are not supported"
        )
    return seen.pop() if seen else (f.int("head_dim"), n_kv)


def gemma_config(path: Path, cj: dict) -> GemmaTextConfig:
    """``GemmaTextConfig`` from a DiffusionGemma ``config.json`` (a one-line CheckpointError for
    anything it cannot express)."""
    tc = cj.get("text_config")
    if not isinstance(tc, dict):
        raise CheckpointError(
            f"{path}/config.json: no text_config object (needed for DiffusionGemma)"
        )
    f, top = Fields(path, tc, "DiffusionGemma"), Fields(path, cj, "DiffusionGemma")
    if (
        top.bool("tie_word_embeddings", True) is False
        or f.bool("tie_word_embeddings", True) is False
    ):
        raise CheckpointError(
            f"{path}/config.json: untied DiffusionGemma weights are not supported"
        )
    act = f.str("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise CheckpointError(f"{path}/config.json: hidden_activation {act!r} is not supported")
    if f.bool("attention_bias", False):
        raise CheckpointError(f"{path}/config.json: attention_bias is not supported")
    bidir = f.str("use_bidirectional_attention", None)
    if bidir not in (None, "vision"):  # "vision": images attend both ways; text stays causal
        raise CheckpointError(
            f"{path}/config.json: use_bidirectional_attention {bidir!r} is not supported"
        )
    n_layers = f.int("num_hidden_layers")
    layer_types = f.list("layer_types", None)
    if layer_types is None:  # the config class's default: 5 sliding to 1 full
        layer_types = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(n_layers)]
    layer_types = list(layer_types)
    if layer_types:
        layer_types[-1] = FULL  # the config class forces the last layer to full attention
    rope = tc.get("rope_parameters") or {
        SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
    }
    full_hd, full_kv = _full_overrides(path, tc, f, layer_types)
    eos = f.ids("eos_token_id", 1)
    cap = tc["final_logit_softcapping"] if "final_logit_softcapping" in tc else 30.0
    try:
        return GemmaTextConfig(
            vocab_size=f.int("vocab_size"),
            d_model=f.int("hidden_size"),
            n_layers=n_layers,
            n_heads=f.int("num_attention_heads"),
            mlp_hidden=f.int("intermediate_size"),
            n_experts=f.int("num_experts"),
            top_k=f.int("top_k_experts"),
            expert_hidden=f.int("moe_intermediate_size"),
            layer_types=layer_types,
            sliding=AttentionShape(
                head_dim=f.int("head_dim"),
                n_kv_heads=f.int("num_key_value_heads"),
                **_rope(path, rope, SLIDING),
            ),
            full=AttentionShape(head_dim=full_hd, n_kv_heads=full_kv, **_rope(path, rope, FULL)),
            sliding_window=f.int("sliding_window", 512),
            norm_eps=f.float("rms_norm_eps", 1e-6),
            final_logit_softcapping=None if cap is None else float(cap),
            max_seq_len=f.int("max_position_embeddings", 131072),
            canvas_length=top.int("canvas_length", 256),
            pad_token_id=f.int("pad_token_id", 0),
            eos_token_ids=eos,
            architecture=ARCHITECTURE,
        )
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}/config.json: {e}") from None


def text_names(names: list[str], n_layers: int) -> dict[str, str]:
    """The network's names of a checkpoint's tensors: ours -> the file's (see the module
    docstring; the decoder's copy of a tied weight wins over the encoder's)."""
    out: dict[str, str] = {}
    from_encoder: dict[str, str] = {}
    for name in names:
        if name.startswith(DECODER):
            out[name[len(DECODER) :]] = name
        elif name.startswith(ENCODER):
            rest = name[len(ENCODER) :]
            m = ENCODER_SCALAR.fullmatch(rest)
            if m:
                out[f"layers.{m[1]}.encoder_layer_scalar"] = name
            else:
                from_encoder[rest] = name  # a copy of a tied weight
        elif not (name.startswith(VISION) or name == "lm_head.weight"):  # vision; the tied head
            out[name] = name  # reported as unexpected by the loader
    for ours, name in from_encoder.items():
        out.setdefault(ours, name)
    for i in range(n_layers):  # a checkpoint without the encoder's buffers: the decoder's value
        if f"layers.{i}.layer_scalar" in out:
            out.setdefault(f"layers.{i}.encoder_layer_scalar", out[f"layers.{i}.layer_scalar"])
    return out


def text_state(state: Mapping[str, torch.Tensor], n_layers: int) -> State:
    """The checkpoint's tensors in the network's names, unread where ``state`` is lazy."""
    names = text_names(list(state), n_layers)
    if isinstance(state, LazyState):
        return state.renamed(names)
    return {ours: state[name] for ours, name in names.items()}


def read_network(path: str | Path) -> tuple[DiffusionGemmaLM, State]:
    """The text network of a DiffusionGemma checkpoint directory on the meta device and its
    tensors in the network's names (unread), names and shapes checked against the config."""
    path = Path(path)
    cj = read_config_json(path)
    archs = cj.get("architectures")
    if not isinstance(archs, list) or not archs or archs[0] != ARCHITECTURE:
        raise CheckpointError(
            f"{path}/config.json: architectures {archs!r} is not {ARCHITECTURE!r}"
        )
    cfg = gemma_config(path, cj)
    state = text_state(read_safetensors(path), cfg.n_layers)
    shapes = expected_names(cfg)
    missing, unexpected = set(shapes) - set(state), set(state) - set(shapes)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the config: missing {sorted(missing)[:4]}, "
            f"unexpected {sorted(unexpected)[:4]}"
        )
    for k in state:
        if shape_of(state, k) != shapes[k]:
            raise CheckpointError(
                f"{path}: {k}: shape {shape_of(state, k)} in the checkpoint, {shapes[k]} in the config"
            )
    with meta_build():
        net = DiffusionGemmaLM(cfg)
    return net, state


def build_network(path: str | Path, fill: Fill, device: torch.device) -> DiffusionGemmaLM:
    """The network of ``read_network`` with its weights set by ``fill(network, state)`` and its
    RoPE tables made on ``device``."""
    net, state = read_network(path)
    fill(net, state)
    net.reset_rope(device)
    return net.eval()


def load_network(
    path: str | Path,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> DiffusionGemmaLM:
    """The text network of a DiffusionGemma checkpoint directory, in ``dtype`` (default float32) on
    ``device`` (default CPU), built on the meta device first (no random init, no second copy)."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    target = dtype or torch.float32

    def fill(net: torch.nn.Module, state: State) -> None:
        net.load_state_dict(
            {k: v.to(device=dev, dtype=target) for k, v in state.items()}, assign=True
        )

    return build_network(path, fill, dev)


def load_tokenizer(path: Path, cj: dict[str, Any]) -> Tokenizer:
    """The checkpoint's tokenizer with its own chat template (see the module docstring)."""
    tok = Tokenizer.from_dir(path)
    processor = path / "chat_template.json"
    if tok.chat_template is None and processor.is_file():
        template = read_json_object(processor).get("chat_template")
        if not isinstance(template, str):
            raise CheckpointError(f"{processor}: no 'chat_template' string")
        try:
            tok.set_chat_template(template)
        except ConfigError as e:
            raise CheckpointError(f"{processor}: {e}") from None
    if tok.chat_template is None:
        raise CheckpointError(
            f"{path}: no chat template (tokenizer_config.json 'chat_template', chat_template.jinja "
            "or chat_template.json); DiffusionGemma is a chat model and needs its own"
        )
    return with_roles(tok, {}, [END_OF_TURN])


DIFFUSION_GEMMA = register_family(
    Family(
        name="diffusion_gemma",
        architectures=(ARCHITECTURE,),
        network=load_network,
        reader=build_network,
        tokenizer=load_tokenizer,
        defaults={"temperature": 1.0},  # the checkpoint's schedule as published
        checkpoints=("google/diffusiongemma-26B-A4B-it",),
        doc="Gemma-4 MoE, causal encoder + bidirectional decoder passes over canvases of uniform "
        "noise (renoising, entropy-bound acceptance, self-conditioning)",
    )
)
