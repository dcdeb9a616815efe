"""Writing matplotlib figures as PNGs, shared by the benchmarks and the evaluation plots
(matplotlib is imported by the callers that draw, so commands that plot nothing never load it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay out, write (creating the folder) and close a matplotlib figure; the PNG's path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
