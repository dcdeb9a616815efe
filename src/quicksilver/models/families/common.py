"""Shared pieces of the family loaders: config.json fields, weight renaming, tokenizer building.

Every failure here is a ``CheckpointError`` with a one-line message naming the file and the field,
so a malformed checkpoint never ends in a traceback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from ...errors import CheckpointError, ConfigError
from ...tokenizer import Tokenizer
from ..checkpoint import State, read_json_object
from ..config import ModelConfig
from ..lazy_state import LazyState

# The Qwen2 / Qwen2.5 pre-tokenizer pattern (GPT-4-like, single digits), used with byte-level BPE.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_MISSING = object()


# the readers below are named after the types they check, so their annotations use these
Key = str | Sequence[str]
Ids = list[int]


class Fields:
    """Typed access to config.json: ``f.int("hidden_size")``; a bad or absent field is a CheckpointError."""

    def __init__(self, path: Path, cj: dict[str, Any], family: str) -> None:
        self.path, self.cj, self.family = path, cj, family

    def _get(self, key: Key, default: Any) -> tuple[str, Any]:
        keys = [key] if isinstance(key, str) else list(key)
        for k in keys:
            if k in self.cj and self.cj[k] is not None:
                return k, self.cj[k]
        if default is _MISSING:
            raise CheckpointError(
                f"{self.path}/config.json: missing {keys[0]!r} (needed for {self.family})"
            )
        return keys[0], default

    def int(self, key: Key, default: Any = _MISSING) -> Any:
        k, v = self._get(key, default)
        if v is None or (isinstance(v, int) and not isinstance(v, bool)):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise CheckpointError(f"{self.path}/config.json: {k!r} must be an integer, got {v!r}")

    def float(self, key: Key, default: Any = _MISSING) -> Any:
        k, v = self._get(key, default)
        if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            return None if v is None else float(v)
        raise CheckpointError(f"{self.path}/config.json: {k!r} must be a number, got {v!r}")

    def bool(self, key: Key, default: Any = _MISSING) -> Any:
        k, v = self._get(key, default)
        if v is None or isinstance(v, bool):
            return v
        raise CheckpointError(f"{self.path}/config.json: {k!r} must be true or false, got {v!r}")

    def str(self, key: Key, default: Any = _MISSING) -> Any:
        k, v = self._get(key, default)
        if v is None or isinstance(v, str):
            return v
        raise CheckpointError(f"{self.path}/config.json: {k!r} must be a string, got {v!r}")

    def list(self, key: Key, default: Any = _MISSING) -> Any:
        k, v = self._get(key, default)
        if v is None or isinstance(v, list):
            return v
        raise CheckpointError(f"{self.path}/config.json: {k!r} must be a list, got {v!r}")

    def ids(self, key: Key, default: Any = _MISSING) -> Ids:
        """A token id or a list of them (``eos_token_id`` may be either)."""
        k, v = self._get(key, default)
        vals = v if isinstance(v, list) else [v]
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in vals):
            raise CheckpointError(
                f"{self.path}/config.json: {k!r} must be a token id or a list of ids, got {v!r}"
            )
        return list(vals)


def make_config(path: Path, **kwargs: Any) -> ModelConfig:
    """ModelConfig(**kwargs); a value it rejects becomes a one-line CheckpointError."""
    try:
        return ModelConfig(**kwargs)
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}/config.json: {e}") from None


def rename(state: State, rules: Iterable[tuple[str, str]]) -> State:
    """Apply the first matching ``(regex, replacement)`` to every name; names no rule matches are kept
    (``build_model`` then reports them as unexpected). A lazy state stays unread."""
    compiled = [(re.compile(p), r) for p, r in rules]
    names: dict[str, str] = {}  # new -> old
    for name in state:
        new = name
        for pat, repl in compiled:
            if pat.fullmatch(name):
                new = pat.sub(repl, name)
                break
        if new in names:
            raise CheckpointError(f"two checkpoint tensors map to {new!r}")
        names[new] = name
    if isinstance(state, LazyState):
        return state.renamed(names)
    return {new: state[old] for new, old in names.items()}


def added_tokens(path: Path) -> dict[str, int]:
    """Added/special tokens (content -> id) declared by tokenizer.json, tokenizer_config.json or
    added_tokens.json; used to find a family's mask token id in any vocabulary size."""
    found: dict[str, int] = {}
    try:
        tj = path / "tokenizer.json"
        if tj.is_file():
            for t in json.loads(tj.read_text()).get("added_tokens", []):
                found[t["content"]] = int(t["id"])
        tc = path / "tokenizer_config.json"
        if tc.is_file():
            for i, t in json.loads(tc.read_text()).get("added_tokens_decoder", {}).items():
                found.setdefault(t["content"], int(i))
        at = path / "added_tokens.json"
        if at.is_file():
            for content, i in json.loads(at.read_text()).items():
                found.setdefault(content, int(i))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{path}: malformed tokenizer files ({e})") from None
    return found


def token_id(path: Path, fields: Fields, config_key: str | None, content: str, default: int) -> int:
    """A special token's id: config.json's ``config_key`` if set, else the id of the token ``content``
    in the tokenizer files, else the family's published id ``default``."""
    if config_key is not None:
        v = fields.int(config_key, None)
        if v is not None:
            return int(v)
    return added_tokens(path).get(content, default)


def with_roles(tok: Tokenizer, roles: dict[str, str], stop_tokens: Sequence[str] = ()) -> Tokenizer:
    """Fill special-token roles the tokenizer config leaves unset (e.g. LLaDA's mask) and add the
    family's end-of-turn tokens to ``stop_tokens`` (only tokens the vocabulary has)."""
    cfg = dict(tok.config)
    for role, content in roles.items():
        if not cfg.get(role) and tok.fast.token_to_id(content) is not None:
            cfg[role] = content
    stops = list(cfg.get("stop_tokens", []))
    for t in stop_tokens:
        if t not in stops and tok.fast.token_to_id(t) is not None:
            stops.append(t)
    cfg["stop_tokens"] = stops
    return Tokenizer(tok.fast, cfg)


def fast_tokenizer_loader(
    roles: dict[str, str], stop_tokens: Sequence[str] = ()
) -> Callable[[Path, dict], Tokenizer]:
    """A tokenizer loader for families that ship ``tokenizer.json`` (with vocab/merges fallback)."""

    def load(path: Path, cj: dict) -> Tokenizer:
        if (path / "tokenizer.json").is_file() or not (path / "vocab.json").is_file():
            return with_roles(Tokenizer.from_dir(path), roles, stop_tokens)
        return with_roles(bpe_tokenizer_from_vocab(path), roles, stop_tokens)

    return load


def _read_tokenizer_config(path: Path) -> dict[str, Any]:
    tc = path / "tokenizer_config.json"
    return read_json_object(tc) if tc.is_file() else {}


def bpe_tokenizer_from_vocab(path: Path, pattern: str = QWEN2_PATTERN) -> Tokenizer:
    """A fast byte-level BPE tokenizer from ``vocab.json`` + ``merges.txt`` (Qwen2 pre-tokenizer, NFC),
    with the added tokens of ``tokenizer_config.json`` / ``added_tokens.json`` at their declared ids.
    This is how Dream's checkpoints (no tokenizer.json, a remote-code slow tokenizer) are read."""
    vj, mt = path / "vocab.json", path / "merges.txt"
    for f in (vj, mt):
        if not f.is_file():
            raise CheckpointError(f"{path}: missing tokenizer.json, and {f.name} to build one from")
    try:
        vocab = json.loads(vj.read_text(encoding="utf-8"))
        merges: list[tuple[str, str]] = []
        for line in mt.read_text(encoding="utf-8").splitlines():
            if not line or line.startswith("#version"):
                continue
            a, b = line.split(" ")
            merges.append((a, b))
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: malformed vocab.json / merges.txt ({str(e).splitlines()[0]})"
        ) from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise CheckpointError(f"{vj}: expected a JSON object of token -> id")
    try:
        fast = FastTokenizer(
            models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
        )
    except Exception as e:  # tokenizers raises plain Exception on bad merges
        raise CheckpointError(
            f"{path}: vocab.json and merges.txt do not form a BPE ({e})"
        ) from None
    fast.normalizer = normalizers.NFC()
    fast.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    fast.decoder = decoders.ByteLevel()
    cfg = _read_tokenizer_config(path)
    declared: dict[int, tuple[str, bool]] = {}
    for i, spec in (cfg.get("added_tokens_decoder") or {}).items():
        declared[int(i)] = (spec["content"], bool(spec.get("special", True)))
    for content, i in added_tokens(path).items():
        declared.setdefault(i, (content, True))
    for i in sorted(declared):
        content, special = declared[i]
        if fast.token_to_id(content) == i:
            continue
        tok = AddedToken(content, special=special, normalized=False)
        (fast.add_special_tokens if special else fast.add_tokens)([tok])
        if fast.token_to_id(content) != i:
            raise CheckpointError(
                f"{path}: added token {content!r} is declared at id {i} but the vocabulary "
                f"puts it at {fast.token_to_id(content)}"
            )
    if not cfg.get("chat_template") and (path / "chat_template.jinja").is_file():
        cfg["chat_template"] = (path / "chat_template.jinja").read_text()
    from jinja2 import TemplateError

    try:
        return Tokenizer(fast, cfg)
    except TemplateError as e:
        raise CheckpointError(
            f"{path}/tokenizer_config.json: chat template does not compile ({e})"
        ) from None


def qwen_config(path: Path, cj: dict, family: str, **fixed: Any) -> ModelConfig:
    """ModelConfig from Qwen2/Qwen3-style keys (``hidden_size``, ``num_attention_heads``, ...) plus the
    family's ``fixed`` choices (attention pattern, shift, bias, mask id, ...)."""
    f = Fields(path, cj, family)
    if cj.get("rope_scaling"):
        raise CheckpointError(
            f"{path}/config.json: rope_scaling {cj['rope_scaling']!r} is not supported"
        )
    if cj.get("use_sliding_window"):
        raise CheckpointError(f"{path}/config.json: sliding-window attention is not supported")
    n_heads = f.int("num_attention_heads")
    eos = f.ids("eos_token_id")
    kwargs: dict[str, Any] = dict(
        vocab_size=f.int("vocab_size"),
        d_model=f.int("hidden_size"),
        n_layers=f.int("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=f.int("num_key_value_heads", n_heads),
        head_dim=f.int("head_dim", None),
        mlp_hidden=f.int("intermediate_size"),
        max_seq_len=f.int("max_position_embeddings", 32768),
        rope_theta=f.float("rope_theta", 10000.0),
        norm_eps=f.float("rms_norm_eps", 1e-6),
        tie_embeddings=f.bool("tie_word_embeddings", False),
        eos_token_ids=eos,
        pad_token_id=f.int("pad_token_id", eos[0]),
        architecture=cj["architectures"][0],
    )
    kwargs.update(fixed)
    return make_config(path, **kwargs)
