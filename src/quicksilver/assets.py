"""Where the package's shipped files live: the embedded model, its AR twin, the edit model and the
diffusion model.

The embedded default (``assets/model``) is the joint network (causal, drafts by diffusion and
verifies itself: sampling/decoders/verify.py); ``assets/model-ar`` its equal-size AR twin
(separate weights, the speed baseline); ``assets/model-edit`` the edit model (``quicksilver-edit``:
the same architecture trained to merge edits, behind the apply and next-edit routes);
``assets/model-diffusion`` the block-diffusion model it replaced (the diffusion decoder's own
shipped model: threshold decoding, revision, infilling with a suffix, canvas views).
"""

from __future__ import annotations

from pathlib import Path

from .errors import QuicksilverError
from .hub import resolve_model as resolve_hub_model

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_MODEL = ASSETS / "model"
EMBEDDED_AR_MODEL = ASSETS / "model-ar"
EMBEDDED_EDIT_MODEL = ASSETS / "model-edit"
EMBEDDED_DIFFUSION_MODEL = ASSETS / "model-diffusion"


def _present(path: Path) -> Path | None:
    return path if (path / "config.json").is_file() else None


def embedded_model_path() -> Path | None:
    """The embedded default model's directory, or None if this build ships none."""
    return _present(EMBEDDED_MODEL)


def embedded_ar_model_path() -> Path | None:
    """The equal-size autoregressive baseline shipped beside it, if any."""
    return _present(EMBEDDED_AR_MODEL)


def embedded_edit_model_path() -> Path | None:
    """The edit model shipped beside it (apply-edit, next-edit), if any."""
    return _present(EMBEDDED_EDIT_MODEL)


def _attention(path: Path) -> str | None:
    import json

    try:
        return str(json.loads((path / "config.json").read_text()).get("attention"))
    except (OSError, ValueError):
        return None


def embedded_diffusion_model_path() -> Path | None:
    """The shipped block-diffusion model: ``assets/model-diffusion``, or the embedded default
    itself in a build where that one is a diffusion model."""
    found = _present(EMBEDDED_DIFFUSION_MODEL)
    if found is None and _attention(EMBEDDED_MODEL) not in (None, "causal"):
        return _present(EMBEDDED_MODEL)
    return found


EMBEDDED = {
    "model": embedded_model_path,
    "AR twin": embedded_ar_model_path,
    "edit model": embedded_edit_model_path,
    "diffusion model": embedded_diffusion_model_path,
}


def resolve_model(
    path: str | Path | None,
    ar: bool = False,
    which: str | None = None,
    revision: str | None = None,
) -> Path:
    """A --model argument (a directory, or a Hub id ``org/name[@revision]`` at ``revision``:
    ``hub.py``), or the shipped model (``ar``: its AR twin; ``which``: a key of
    ``EMBEDDED``) when none is given; a one-line QuicksilverError if this build ships none."""
    if path:
        return resolve_hub_model(path, revision)
    if revision is not None:
        raise QuicksilverError(f"--revision {revision} names a revision of a Hub id --model")
    name = which or ("AR twin" if ar else "model")
    found = EMBEDDED[name]()
    if found is None:
        raise QuicksilverError(f"no --model given and no embedded {name} is installed")
    return found
