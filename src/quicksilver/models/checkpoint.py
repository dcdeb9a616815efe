"""Checkpoint directories: HF-style ``config.json`` + ``model.safetensors`` + tokenizer files.

Loading dispatches on ``config.json``'s ``architectures`` through a registry of loaders (our own
format here; the open diffusion LMs register theirs): ``load_checkpoint`` builds the generic
``Transformer``, ``load_network`` the families whose network is their own (DiffusionGemma). Nothing is ever downloaded. Weight files are
checked before use (``integrity.py``: header against size, no NaN/inf); ``save`` writes
``model.sha256``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from ..errors import CheckpointError
from ..tokenizer import Tokenizer
from .config import NATIVE_ARCHITECTURE, ModelConfig
from .integrity import check_safetensors, write_checksums
from .lazy_state import LazyState, shape_of
from .meta import meta_build
from .transformer import Rotary, Transformer


class NetworkConfig(Protocol):
    """What the layers above read of any network's config (``ModelConfig``, or a family's own)."""

    @property
    def architecture(self) -> str: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_seq_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> list[int]: ...


class Network(Protocol):
    """A loaded network: the generic ``Transformer``, or a family's own (``DiffusionGemmaLM``)."""

    @property
    def config(self) -> NetworkConfig: ...

    def num_params(self) -> int: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...

    def eval(self) -> torch.nn.Module: ...


# architecture name -> function(path, config.json dict) -> (ModelConfig, state dict in our names)
Loader = Callable[[Path, dict], tuple[ModelConfig, "State"]]
LOADERS: dict[str, Loader] = {}
# architecture name -> function(path, dtype, device) -> a family's own network, for the families
# that are not the generic transformer (DiffusionGemma): ``quicksilver.load`` runs these,
# ``load_checkpoint`` refuses them
NetworkLoader = Callable[[Path, torch.dtype, torch.device], Network]
NETWORK_LOADERS: dict[str, NetworkLoader] = {}
# architecture name -> function(path, fill, device) -> that network built on the meta device, its
# weights set by ``fill(network, state)`` from its tensors in the network's names (unread until
# fill reads them: a quantized load, runtime/quantize.py), then its own buffers made on ``device``
Fill = Callable[[torch.nn.Module, "State"], None]
NetworkReader = Callable[[Path, Fill, torch.device], Network]
NETWORK_READERS: dict[str, NetworkReader] = {}
# architecture name -> function(path, config.json dict) -> Tokenizer (default: Tokenizer.from_dir)
TokenizerLoader = Callable[[Path, dict], Tokenizer]
TOKENIZER_LOADERS: dict[str, TokenizerLoader] = {}

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (a key of ``DTYPES``)."""
    return str(dtype).removeprefix("torch.")


def register_loader(*architectures: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        for a in architectures:
            LOADERS[a] = fn
        return fn

    return deco


def read_json_object(f: Path, what: str = "a JSON object") -> dict:
    """A JSON file that must hold an object; anything else is a one-line CheckpointError."""
    try:
        d = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{f}: invalid JSON ({e})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{f}: expected {what}")
    return d


def read_config_json(path: Path) -> dict:
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not path.is_dir():
        raise CheckpointError(f"{path}: a checkpoint must be a directory")
    cj = path / "config.json"
    if not cj.is_file():
        raise CheckpointError(f"{path}: missing config.json")
    return read_json_object(cj)


State = Mapping[str, torch.Tensor]  # a checkpoint's tensors by name (``LazyState`` when read)


def read_safetensors(path: Path) -> LazyState:
    """Every tensor of a directory, read when asked for (``LazyState``): ``model.safetensors`` or
    the shards listed in an index, their headers checked against their sizes now."""
    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    try:
        if single.is_file():
            check_safetensors(single)
            return LazyState.of_files(single, [single])
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if not (path / shard).is_file():
                    raise CheckpointError(
                        f"{path}: shard {shard} listed in model.safetensors.index.json is missing"
                    )
                check_safetensors(path / shard)
            out = LazyState.of_files(index, [path / shard for shard in shards])
            absent = sorted(set(weight_map) - set(out))
            if absent:
                raise CheckpointError(
                    f"{path}: tensors listed in the index are absent from the shards: {absent[:4]}"
                )
            return out
    except (
        SafetensorError,
        OSError,
        KeyError,
        TypeError,
        AttributeError,
        json.JSONDecodeError,
    ) as e:
        raise CheckpointError(f"{path}: unreadable weights ({str(e).splitlines()[0]})") from None
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


@register_loader(NATIVE_ARCHITECTURE)
def _load_native(path: Path, cj: dict) -> tuple[ModelConfig, State]:
    return ModelConfig.from_hf_json(cj), read_safetensors(path)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# From this many parameters a CPU computes in bfloat16 by default: at the Fast-dLLM v2 1.5B shape
# on the 2-vCPU EPYC (`bench shapes`, one thread) bf16 takes 335 ms per AR token vs 373 for fp32
# and 375 vs 979 ms for an 8-wide window step (docs/LOG.md, 2026-12-01); below it float32 keeps the
# exported CPU step runtimes (float32 only, runtime/cpu_backends.py), faster at the shipped size.
BF16_CPU_PARAMS = 500_000_000


def default_dtype(n_params: int, device: torch.device) -> torch.dtype:
    """The compute dtype when none is asked for: bfloat16 on CUDA and for CPU models of at least
    ``BF16_CPU_PARAMS`` parameters, float32 otherwise."""
    if device.type == "cuda" or n_params >= BF16_CPU_PARAMS:
        return torch.bfloat16
    return torch.float32


def check_state(cfg: ModelConfig, state: State) -> State:
    """``state`` without a tied head, after checking its names and shapes against the config
    (headers only where it is lazy); a CheckpointError naming what differs."""
    with meta_build():
        shapes = {k: tuple(t.shape) for k, t in Transformer(cfg).state_dict().items()}
    if cfg.tie_embeddings and "lm_head.weight" in state:
        keep = {k: k for k in state if k != "lm_head.weight"}
        state = state.renamed(keep) if isinstance(state, LazyState) else {k: state[k] for k in keep}
    expected = {k for k in shapes if not (cfg.tie_embeddings and k == "lm_head.weight")}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"weights do not match the config: missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}"
        )
    for k in state:
        if shapes[k] != shape_of(state, k):
            raise CheckpointError(
                f"{k}: shape {shape_of(state, k)} in the checkpoint, {shapes[k]} in the config"
            )
    return state


def build_model(
    cfg: ModelConfig,
    state: State,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> Transformer:
    """The network with ``state`` as its weights, built on the meta device first (no random init, no
    second copy of an 8B model in memory), in ``dtype`` (default float32) on ``device`` (default CPU)."""
    target = dtype or torch.float32
    dev = torch.device(device) if device is not None else torch.device("cpu")
    state = check_state(cfg, state)
    with meta_build():
        model = Transformer(cfg)
    floating = {
        k: v.to(device=dev, dtype=target if v.is_floating_point() else v.dtype)
        for k, v in state.items()
    }
    model.load_state_dict(floating, strict=False, assign=True)
    if cfg.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # non-persistent buffer: recompute
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta, cfg.max_seq_len).to(dev)
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"tensors not set by the checkpoint: {left[:4]}")
    return model.eval()


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a checkpoint directory, as its family stores it."""
    path = Path(path)
    cj = read_config_json(path)
    archs = cj.get("architectures")
    tok_loader = TOKENIZER_LOADERS.get(archs[0]) if isinstance(archs, list) and archs else None
    return tok_loader(path, cj) if tok_loader is not None else Tokenizer.from_dir(path)


def architecture(path: str | Path) -> str:
    """The checkpoint's ``config.json`` ``architectures[0]`` (what loading dispatches on)."""
    path = Path(path)
    archs = read_config_json(path).get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise CheckpointError(f"{path}/config.json: no 'architectures' list")
    return archs[0]


def load_family_network(
    path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[Network, Tokenizer]:
    """A family's own network (``NETWORK_LOADERS``) and its tokenizer, in ``dtype`` (default:
    bfloat16 on a GPU, float32 on the CPU) on ``device`` (default: a GPU if there is one)."""
    path = Path(path)
    arch = architecture(path)
    if arch not in NETWORK_LOADERS:
        raise CheckpointError(f"{path}: {arch!r} is not a family with a network of its own")
    dev = torch.device(device) if device is not None else default_device()
    tokenizer = load_tokenizer(path)
    net = NETWORK_LOADERS[arch](path, dtype or default_dtype(0, dev), dev)
    if tokenizer.vocab_size > net.config.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens, model only {net.config.vocab_size}"
        )
    return net, tokenizer


def read_checkpoint(path: str | Path) -> tuple[ModelConfig, State, Tokenizer]:
    """The generic transformer's config, its tensors (unread where the loader only renames them)
    and the tokenizer of a checkpoint directory."""
    path = Path(path)
    arch = architecture(path)
    if arch in NETWORK_LOADERS:
        raise CheckpointError(
            f"{path}: {arch} runs a network of its own, not the generic transformer "
            "(quicksilver.load, generate, serve and info load it)"
        )
    loader = LOADERS.get(arch)
    if loader is None:
        known = sorted([*LOADERS, *NETWORK_LOADERS])
        raise CheckpointError(f"{path}: unsupported architecture {arch!r} (known: {known})")
    cj = read_config_json(path)
    tokenizer = load_tokenizer(path)
    cfg, state = loader(path, cj)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise CheckpointError(
            f"{path}: tokenizer has {tokenizer.vocab_size} tokens, model only {cfg.vocab_size}"
        )
    return cfg, state, tokenizer


def load_checkpoint(
    path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device | None = None
) -> tuple[Transformer, Tokenizer]:
    """Model and tokenizer of a checkpoint directory, in ``dtype`` (default: ``default_dtype``)."""
    cfg, state, tokenizer = read_checkpoint(path)
    dev = device_of(device)
    return build_model(cfg, state, dtype or default_model_dtype(cfg, dev), dev), tokenizer


def device_of(device: str | torch.device | None) -> torch.device:
    """The device asked for, or ``default_device``."""
    return torch.device(device) if device is not None else default_device()


def default_model_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    """``default_dtype`` for a network of this config (its size from a meta network)."""
    with meta_build():
        return default_dtype(Transformer(cfg).num_params(), device)


def save_checkpoint(
    model: Transformer,
    tokenizer: Tokenizer,
    path: str | Path,
    dtype: str = "float32",
    extra: dict[str, dict] | None = None,
) -> Path:
    """Write a checkpoint directory; ``extra`` adds JSON files (e.g. ``{"train_config": {...}}``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    state = {
        k: v.detach().to(DTYPES[dtype]).contiguous()
        for k, v in model.state_dict().items()
        if not (cfg.tie_embeddings and k == "lm_head.weight")
    }
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    write_checksums(path)
    hf = cfg.to_hf_json()
    hf["torch_dtype"] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    tokenizer.save(path)
    for name, obj in (extra or {}).items():
        (path / f"{name}.json").write_text(json.dumps(obj, indent=2) + "\n")
    return path
