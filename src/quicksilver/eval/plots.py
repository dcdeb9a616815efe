"""PNG plots of the evaluation: accuracy against TPF (from a sweep) and learning curves (from the
``eval`` records in a run's ``metrics.jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..figures import save_figure  # noqa: E402


def plot_accuracy_vs_tpf(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """rows: {"label", "tpf", "accuracy", "tasks": {name: acc}}; one point per decoding setting."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    for g, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["tpf"])
        ax.plot([r["tpf"] for r in rs], [r["accuracy"] for r in rs], "o-", label=g)
        for r in rs:
            ax.annotate(
                r["short"],
                (r["tpf"], r["accuracy"]),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlabel("TPF (committed tokens per forward pass)")
    ax.set_ylabel("mean held-out accuracy")
    ax.set_title(title or "accuracy vs tokens per forward pass")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def steps_before(train_config: Path, seen: frozenset[Path] = frozenset()) -> int:
    """Training steps behind a run's starting weights: its ``init_from`` checkpoint's steps plus
    those behind that one, down the chain of stages (0 for a run from scratch; a chain that comes
    back to a checkpoint already counted, as a path reused for newer weights can, stops there)."""
    init = json.loads(train_config.read_text()).get("init_from") if train_config.is_file() else None
    if not init or Path(init).resolve() in seen or not (Path(init) / "train_state.json").is_file():
        return 0
    steps = int(json.loads((Path(init) / "train_state.json").read_text()).get("step", 0))
    return steps + steps_before(Path(init) / "train_config.json", seen | {Path(init).resolve()})


def read_curve(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's eval records. A run started from another checkpoint (``init_from``) continues that
    one's step count, so curves compare equal training budgets."""
    recs = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "eval" in r:
            recs.append(r)
    cfgs = sorted(Path(run_dir).glob("step_*/train_config.json"))
    offset = steps_before(cfgs[0]) if cfgs else 0
    return [{**r, "step": r["step"] + offset} for r in recs]


def plot_learning_curves(runs: dict[str, str | Path], path: str | Path) -> Path:
    """One panel per task: held-out accuracy against training steps, one line per run (runs trained on
    the same data stream see the same examples at the same step)."""
    curves = {label: read_curve(d) for label, d in runs.items()}
    tasks = sorted({t for recs in curves.values() for r in recs for t in r["eval"]})
    n = len(tasks)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for i, task in enumerate(tasks):
        ax = axes[i // cols][i % cols]
        for label, recs in curves.items():
            pts = [(r["step"], r["eval"][task]) for r in recs if task in r["eval"]]
            if pts:
                ax.plot(*zip(*pts), "o-", label=label, markersize=3)
        ax.set_title(task, fontsize=9)
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("training steps (batches of 32 examples)", fontsize=8)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].axis("off")
    return save_figure(fig, path)
