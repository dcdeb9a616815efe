"""Where the package's shipped files live (the embedded model)."""
from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_MODEL = ASSETS / "model"


def embedded_model_path() -> Path | None:
    """The embedded default model's directory, or None if this build ships none."""
    return EMBEDDED_MODEL if (EMBEDDED_MODEL / "config.json").is_file() else None
