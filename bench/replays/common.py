"""Shared by the replay experiments: supplies (openb, synthetic), outputs (CSV, Markdown, PNG)."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "replay"
Row = Mapping[str, Any]


def openb_gpu_nodes(openb: Path) -> list[tuple[str, int, str]]:
    """(node, GPUs, model) of every GPU node in ``openb_node_list_gpu_node.csv``."""
    with open(openb / "openb_node_list_gpu_node.csv", newline="") as f:
        return [(r["sn"], int(r["gpu"]), r["model"]) for r in csv.DictReader(f) if int(r["gpu"])]


def synthetic_nodes(gpus: int, seed: int) -> list[int]:
    """A heterogeneous cluster of about ``gpus`` GPUs: nodes of 1, 2, 4 and 8 GPUs."""
    rng = np.random.default_rng(seed)
    nodes: list[int] = []
    while sum(nodes) < gpus:
        nodes.append(int(rng.choice([1, 2, 4, 8], p=[0.1, 0.2, 0.3, 0.4])))
    return nodes


def jain(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    if not kept or not any(kept):
        return float("nan")
    return sum(kept) ** 2 / (len(kept) * sum(v * v for v in kept))


def write_table(name: str, rows: Sequence[Row], *, title: str, note: str = "") -> None:
    """``docs/replay/<name>.csv`` and ``<name>.md`` (numbers to 4 significant digits)."""
    out = OUT  # read at call time: bench/replay.py --out replaces it
    out.mkdir(parents=True, exist_ok=True)
    columns = list(rows[0])
    with open(out / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _cell(v) for k, v in r.items()} for r in rows)
    lines = [f"# {title}", ""]
    if note:
        lines += [note, ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def plot(
    name: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    kind: str = "line",
) -> None:
    """``docs/replay/<name>.png``: one line (or bar group) per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    if kind == "bar":
        labels = list(series)
        xs, ys = zip(*(series[k] for k in labels), strict=True)
        width = 0.8 / max(len(xs[0]), 1)
        for i in range(len(xs[0])):
            axes.bar(
                [j + i * width for j in range(len(labels))],
                [y[i] for y in ys],
                width,
                label=str(xs[0][i]),
            )
        axes.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=20)
    else:
        for label, (x, y) in series.items():
            axes.plot(x, y, marker="o", label=label)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    out = OUT  # read at call time: bench/replay.py --out replaces it
    out.mkdir(parents=True, exist_ok=True)
    figure.savefig(out / f"{name}.png")
    plt.close(figure)
