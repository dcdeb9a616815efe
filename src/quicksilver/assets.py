"""Where the package's shipped files live (the embedded model and its AR baseline)."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_MODEL = ASSETS / "model"
EMBEDDED_AR_MODEL = ASSETS / "model-ar"


def _present(path: Path) -> Path | None:
    return path if (path / "config.json").is_file() else None


def embedded_model_path() -> Path | None:
    """The embedded default (diffusion) model's directory, or None if this build ships none."""
    return _present(EMBEDDED_MODEL)


def embedded_ar_model_path() -> Path | None:
    """The equal-size autoregressive baseline shipped beside it, if any."""
    return _present(EMBEDDED_AR_MODEL)
