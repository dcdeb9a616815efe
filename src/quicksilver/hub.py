"""Checkpoints named by Hugging Face Hub id: ``org/name``, ``org/name@revision``.

Contract of ``resolve_model(name, revision)``:

- an existing local path is returned as it is (relative paths too), whatever ``revision`` says:
  the revision names a Hub revision, and resolving the returned directory again gives it back;
- a name that does not exist locally and is neither ``org/name[@revision]`` nor given a
  ``revision`` is returned as it is too: the checkpoint loader reports the missing directory;
- otherwise it is a Hub id, resolved by ``huggingface_hub.snapshot_download`` to a snapshot
  directory of the Hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, read when called): the
  cache first (no network), then a download of the checkpoint's files (``CHECKPOINT_FILES``) only
  where the network is allowed (not with ``HF_HUB_OFFLINE=1``). The snapshot returned holds
  ``config.json`` and all its weights;
- every failure (malformed id, a revision given twice, unknown id or revision, not cached while
  offline, an incomplete snapshot, a failed download) is a one-line ``ConfigError``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError

# The files a checkpoint directory is read from (models/checkpoint.py, the families' tokenizers,
# the sampler defaults, the integrity file); `*` also matches inside subfolders.
CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "sampler_config.json",
    "model.sha256",
    "*.safetensors",
    "*.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name: the shape a Hub id has
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's true values of an env flag


def resolve_model(
    name: str | Path, revision: str | None = None, *, also: Sequence[str] = ()
) -> Path:
    """The checkpoint directory ``name`` stands for (see the module's contract); ``also``: more
    file patterns to fetch with a Hub checkpoint (e.g. ``("*.gguf",)``)."""
    text = str(name)
    if Path(text).exists():
        return Path(text)
    repo_id, rev = parse_hub_id(text, revision)
    if repo_id is None:
        return Path(text)
    try:
        return snapshot(repo_id, rev, (*CHECKPOINT_FILES, *also))
    except ConfigError as e:  # a mistyped local path has a Hub id's shape too: say both
        raise ConfigError(f"no directory {text!r} here, and as a Hub id: {e}") from None


def parse_hub_id(name: str, revision: str | None = None) -> tuple[str | None, str | None]:
    """``(repo_id, revision)`` of ``org/name[@revision]`` (``revision`` from the argument when the
    name has none); ``(None, None)`` for a name that is no Hub id and names no revision."""
    base, at, rev = name.partition("@")
    if not at and revision is None and not _ID.fullmatch(name):
        return None, None
    if at and not rev:
        raise ConfigError(f"{name!r}: empty revision after '@' (use org/name@revision)")
    if at and revision is not None and revision != rev:
        raise ConfigError(f"{name!r} names revision {rev!r} but --revision says {revision!r}")
    if revision is not None and not revision:
        raise ConfigError("--revision: empty revision")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if not _ID.fullmatch(base):
            raise HFValidationError("not org/name")
        validate_repo_id(base)
    except HFValidationError:
        raise ConfigError(
            f"{name!r} is neither a local directory nor a Hub id (org/name[@revision])"
        ) from None
    return base, rev or revision


def hub_cache_dir() -> Path:
    """The Hub cache as huggingface_hub derives it, from the environment of now (its own constants
    are read once, at import)."""
    home = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
    home = os.path.expandvars(os.path.expanduser(os.getenv("HF_HOME", home)))
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return Path(os.path.expandvars(os.path.expanduser(os.getenv("HF_HUB_CACHE", legacy))))


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set to a true value now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def missing_files(path: Path) -> list[str]:
    """What a snapshot lacks of a loadable checkpoint: ``config.json`` and its weights
    (``model.safetensors``, or every shard its index lists)."""
    missing = [] if (path / "config.json").is_file() else ["config.json"]
    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file():
        return missing
    if not index.is_file():
        return [*missing, "model.safetensors"]
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [*missing, "a readable model.safetensors.index.json"]
    return missing + [s for s in shards if not (path / s).is_file()]


def snapshot(repo_id: str, revision: str | None, patterns: Sequence[str]) -> Path:
    """The cached snapshot of ``repo_id`` at ``revision`` (default: main), downloaded first where
    the cache lacks it and the network is allowed."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    label = repo_id + (f"@{revision}" if revision else "")
    cache = hub_cache_dir()
    kw: dict[str, Any] = {
        "revision": revision,
        "cache_dir": str(cache),
        "allow_patterns": list(patterns),
    }
    path: Path | None = None
    try:
        path = Path(snapshot_download(repo_id, local_files_only=True, **kw))
    except LocalEntryNotFoundError:
        pass
    except (OSError, ValueError) as e:  # an unreadable cache, a revision it cannot hold
        raise ConfigError(f"{label}: cannot read the Hub cache {cache}: {_first_line(e)}") from None
    if path is not None and not missing_files(path):
        return path
    if hub_offline():
        if path is None:
            raise ConfigError(
                f"{label}: not in the Hub cache {cache} and HF_HUB_OFFLINE is set "
                f"(fetch it where the network is allowed: hf download {repo_id}"
                + (f" --revision {revision})" if revision else ")")
            )
        raise ConfigError(
            f"{label}: the cached snapshot {path} is incomplete (missing "
            f"{', '.join(missing_files(path))}) and HF_HUB_OFFLINE is set"
        )
    try:
        path = Path(snapshot_download(repo_id, **kw))
    except GatedRepoError:
        raise ConfigError(
            f"{label}: a gated model on the Hub (accept its terms, set HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{label}: no such model on the Hub (or a private one: set HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(f"{label}: no revision {revision!r} of {repo_id} on the Hub") from None
    except LocalEntryNotFoundError:
        raise ConfigError(
            f"{label}: not in the Hub cache {cache} and the Hub is unreachable"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ConfigError(f"{label}: download from the Hub failed: {_first_line(e)}") from None
    missing = missing_files(path)
    if missing:
        raise ConfigError(
            f"{label}: not a checkpoint quicksilver loads (missing {', '.join(missing)})"
        )
    return path


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
