"""Shared benchmark plumbing: medians, a rich table, the final JSON line, PNG bar plots."""

from __future__ import annotations

import json
import math
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from ..figures import save_figure


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read after it times the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calls_per_second(fn: Callable[[], Any], device: torch.device, iters: int, warmup: int) -> float:
    """How many calls of ``fn`` the device completes a second (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync(device)
    return iters / (time.perf_counter() - t0)


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


PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def value_text(v: float) -> str:
    """A bar's value as printed beside it: whole from 10 up (thousands grouped), else 2 decimals."""
    return f"{v:,.0f}" if abs(v) >= 10 else f"{v:.2f}"


def bar_plot(path: Path, labels: list[str], series: dict[str, list[float]], title: str) -> Path:
    """One panel per series, horizontal bars: the labels read once, level, down the left side;
    each bar's value is printed at its end, so no figure is read off an axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(lb) for lb in labels) * 0.07 + 3.0 * len(series)
    fig, axes = plt.subplots(
        1, len(series), figsize=(width, 1.2 + 0.32 * len(labels)), sharey=True, squeeze=False
    )
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(labels))]
    for ax, (name, vals) in zip(axes[0], series.items()):
        bars = ax.barh(labels, vals, color=colors)
        ax.bar_label(bars, [value_text(v) for v in vals], padding=2, fontsize=8)
        ax.set_xlim(0, 1.3 * max([v for v in vals if math.isfinite(v)] + [1e-9]))
        ax.set_title(name)
        ax.tick_params(axis="x", labelsize=8)
    axes[0][0].invert_yaxis()  # the first method on top, the order of the table
    fig.suptitle(title)
    return save_figure(fig, path)


def count_ticks(ax: Any, xs: Sequence[float]) -> None:
    """Tick the x axis at the measured values themselves (1, 4, 16 rather than 10^0, 10^1)."""
    from matplotlib.ticker import NullLocator

    ax.set_xticks(list(xs), [f"{x:g}" for x in xs])
    ax.xaxis.set_minor_locator(NullLocator())


def line_plot(
    path: Path, xs: Sequence[float], series: dict[str, list[float]], xlabel: str, title: str
) -> Path:
    """One axis, one line per series over ``xs``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, ys in series.items():
        ax.plot(xs, ys, "o-", label=name)
    ax.set_xlabel(xlabel)
    count_ticks(ax, xs)
    ax.legend(fontsize=8)
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


def time_ms(fn: Any, iters: int) -> float:
    """Median wall time of ``fn()`` in ms over ``iters`` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def current_rss_bytes() -> int:
    """This process's resident memory now (Linux: /proc/self/statm)."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux: ru_maxrss in KiB)."""
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
