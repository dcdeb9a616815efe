"""Shared benchmark plumbing: medians, a rich table, the final JSON line, PNG bar plots."""

from __future__ import annotations

import json
import math
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..figures import save_figure


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")


def hardware() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model and the vector/matrix flags that set speed."""
    import os

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                info["cpu_flags"] = [f for f in SPEED_FLAGS if f in have]
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c not in ("method", "config") else "left")
    for r in rows:
        t.add_row(*[f"{v:.2f}" if isinstance(v, float) else str(v) for v in r])
    Console(stderr=False).print(t)


def bar_plot(path: Path, labels: list[str], series: dict[str, list[float]], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.6))
    axes = [axes] if len(series) == 1 else list(axes)
    for ax, (name, vals) in zip(axes, series.items()):
        ax.bar(
            labels, vals, color=["#888888", "#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(vals)]
        )
        ax.set_title(name)
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(title)
    return save_figure(fig, path)


def line_plot(
    path: Path, xs: Sequence[float], series: dict[str, list[float]], xlabel: str, title: str
) -> Path:
    """One axis, one line per series over ``xs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for name, ys in series.items():
        ax.plot(xs, ys, "o-", label=name)
    ax.set_xlabel(xlabel)
    ax.legend()
    fig.suptitle(title)
    return save_figure(fig, path)


def emit_json(obj: dict[str, Any]) -> None:
    """The benchmark's last line: one strict JSON object (NaN and infinities become null)."""
    print(json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False), flush=True)


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
