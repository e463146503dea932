"""``gpushare estimator evaluate``: a model on labelled records, as figures and a report.

``evaluate`` is pure numpy: the metrics (JSON) and the curves a person reads (nominal
against achieved coverage, predicted against true retention, and for each gate floor the
precision/recall curve of the threshold on P(retention >= floor) with the model's operating
point marked, next to every baseline that applies). ``write`` draws them with matplotlib
(imported only here, only when a report is asked for) as PNG files and a Markdown summary,
with the model's learned-on-node history when it has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator import operating
from agent.estimator.evaluation import (
    GATE_FLOORS,
    baselines,
    gate,
    precision_recall,
    scores,
    util_rule_applies,
    util_sum,
)
from agent.estimator.model import Estimates, RetentionModel
from agent.estimator.records import Record

PLOTS = ("calibration.png", "predicted_vs_true.png", "gate.png")
CURVE_THRESHOLDS = tuple(round(0.01 * i, 2) for i in range(101))


def evaluate(
    model: RetentionModel, records: Sequence[Record], precision: float | None = None
) -> dict[str, Any]:
    """Metrics and curves of ``model`` on ``records``; the gate at ``precision`` (default:
    the one the model was trained for)."""
    precision = precision or float(model.metadata.get("gate", {}).get("precision", 0.95))
    truth = np.asarray([r.retention or 0.0 for r in records], dtype=np.float64)
    found = model.estimate(records)
    metrics: dict[str, Any] = {
        "records": len(records),
        **scores(truth, found.mean),
        "estimator": model.kind,
        "gate_precision_target": precision,
        **_gate_at_operating_point(model, found, truth, precision),
        "lower": gate(truth, found.lower),
    }
    curves: dict[str, Any] = {"truth": truth, "mean": found.mean, "lower": found.lower}
    calibration = model.metadata.get("calibration")
    if calibration:
        achieved = [
            float(np.mean(truth >= _lower_at(found, calibration, c))) for c in calibration["levels"]
        ]
        metrics["coverage_nominal"] = model.coverage
        metrics["coverage_achieved"] = float(np.mean(truth >= found.lower))
        curves["nominal"], curves["achieved"] = list(calibration["levels"]), achieved
    metrics["baselines"] = baselines(records, truth, precision)
    curves["gate"] = _gate_curves(model, records, found, truth, precision)
    return {"metrics": metrics, "curves": curves}


def _lower_at(found: Any, calibration: dict[str, Any], coverage: float) -> Any:
    q = cal.q_at(calibration, coverage)
    return cal.lower(found.mean, found.spread, q, calibration["eps"], calibration["edges"])


def _gate_at_operating_point(
    model: RetentionModel, found: Estimates, truth: Any, precision: float
) -> dict[str, Any]:
    """The gate's precision and recall here at each floor, and what it promised: its
    precision on held-out families in the model's own cross-validation."""
    result: dict[str, Any] = {}
    stored = model.metadata.get("gate")
    for floor in GATE_FLOORS:
        _p, admitted = model.admits(found, floor, precision)
        got_precision, got_recall = precision_recall(truth, admitted, floor)
        result[f"gate_precision_at_{floor}"] = got_precision
        result[f"gate_recall_at_{floor}"] = got_recall
        if stored:
            result[f"gate_threshold_at_{floor}"] = model.threshold(floor, precision)
            result[f"cv_heldout_precision_at_{floor}"] = operating.at(
                stored, "heldout_precision", floor, precision
            )
    return result


def _gate_curves(
    model: RetentionModel, records: Sequence[Record], found: Any, truth: Any, precision: float
) -> dict[str, Any]:
    """Per floor: the model's precision and recall at every threshold on P(keep), its
    operating point, and the sum rule's curve over its limit where it applies."""
    curves: dict[str, Any] = {}
    sums = np.asarray([util_sum(r) for r in records]) if util_rule_applies(records) else None
    for floor in GATE_FLOORS:
        p, admitted = model.admits(found, floor, precision)
        points = [precision_recall(truth, p >= t, floor) for t in CURVE_THRESHOLDS]
        entry: dict[str, Any] = {
            "model": ([a for a, _b in points], [b for _a, b in points]),
            "operating_point": precision_recall(truth, admitted, floor),
        }
        if sums is not None:
            limits = np.linspace(0.0, 300.0, 121)
            rule = [precision_recall(truth, sums <= limit, floor) for limit in limits]
            entry["util_sum"] = ([a for a, _b in rule], [b for _a, b in rule])
        curves[str(floor)] = entry
    return curves


def write(out: Path, result: dict[str, Any], model: RetentionModel, data_name: str) -> list[Path]:
    """The PNG plots and ``summary.md`` under ``out``; the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValidationError(
            "--report", "needs matplotlib: pip install 'gpushare[bench]' (or matplotlib)"
        ) from exc
    out.mkdir(parents=True, exist_ok=True)
    curves, metrics = result["curves"], result["metrics"]
    paths = []
    fig, ax = plt.subplots(figsize=(4.2, 4), dpi=80)
    ax.plot([0.5, 1], [0.5, 1], color="grey", lw=1, label="ideal")
    ax.fill_between([0.5, 1], [0.47, 0.97], [0.53, 1.03], color="grey", alpha=0.15, label="±3 pts")
    cv = model.metadata.get("coverage_curve")
    if cv:
        ax.plot(cv["nominal"], cv["achieved"], label="grouped CV (training)")
    if "achieved" in curves:
        ax.plot(curves["nominal"], curves["achieved"], label=f"{data_name}")
    _finish(ax, "nominal coverage", "achieved coverage", "Calibration of retention_lower")
    paths.append(_save(fig, out / PLOTS[0], plt))
    fig, ax = plt.subplots(figsize=(4.2, 4), dpi=80)
    ax.scatter(curves["truth"], curves["mean"], s=4, alpha=0.4, label="predicted (mean)")
    ax.scatter(curves["truth"], curves["lower"], s=4, alpha=0.4, label="retention_lower")
    ax.plot([0, 1], [0, 1], color="grey", lw=1)
    _finish(ax, "true retention", "predicted retention", "Predicted against true")
    paths.append(_save(fig, out / PLOTS[1], plt))
    paths.append(_save(_gate_figure(plt, curves["gate"]), out / PLOTS[2], plt))
    summary = out / "summary.md"
    summary.write_text(markdown(metrics, model, data_name))
    return [*paths, summary]


def _gate_figure(plt: Any, gates: dict[str, Any]) -> Any:
    """One panel per floor: precision against recall as the threshold moves, the model's
    operating point marked, the sum rule's curve beside it where it applies."""
    fig, axes = plt.subplots(1, len(gates), figsize=(3.4 * len(gates), 3.4), dpi=80)
    for ax, (floor, entry) in zip(np.atleast_1d(axes), gates.items(), strict=True):
        precision, recall = entry["model"]
        ax.plot(recall, precision, label="P(keep) threshold")
        if "util_sum" in entry:
            rule_precision, rule_recall = entry["util_sum"]
            ax.plot(rule_recall, rule_precision, label="sum of gpu_util <= T", ls="--")
        at_precision, at_recall = entry["operating_point"]
        ax.scatter([at_recall], [at_precision], color="red", zorder=3, label="operating point")
        _finish(ax, "recall", "precision", f"Gate at floor {floor}")
    return fig


def _finish(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def markdown(metrics: dict[str, Any], model: RetentionModel, data_name: str) -> str:
    meta = model.metadata
    lines = [
        f"# Retention estimator on {data_name}",
        "",
        f"Model: {meta.get('data_sha256', '?')[:12]} ({meta.get('provenance', '?')}), "
        f"{meta.get('records', '?')} training records; answers with: {metrics['estimator']}.",
        "",
        f"{metrics['records']} records: MAE {metrics['mae']:.3f}, RMSE {metrics['rmse']:.3f}.",
    ]
    if "coverage_achieved" in metrics:
        lines += [
            "",
            f"`retention_lower` coverage: nominal {metrics['coverage_nominal']:.2f}, achieved "
            f"{metrics['coverage_achieved']:.3f} here"
            + _cv_coverage(meta)
            + ". ![calibration](calibration.png)",
        ]
    lines += [
        "",
        f"The gate at precision {metrics['gate_precision_target']:.2f} (its operating point "
        "on P(retention >= floor)), next to the baselines that apply here:",
        "",
        "| gate | floor | precision | recall |",
        "|---|---|---|---|",
    ]
    rows = [
        ("model", metrics),
        ("model, retention_lower >= floor", metrics["lower"]),
        *metrics["baselines"].items(),
    ]
    for floor in GATE_FLOORS:
        for name, values in rows:
            if f"gate_precision_at_{floor}" in values:
                lines.append(
                    f"| {name} | {floor} | {_cell(values[f'gate_precision_at_{floor}'])} "
                    f"| {_cell(values[f'gate_recall_at_{floor}'])} |"
                )
    lines += ["", "![gate](gate.png) ![predicted against true](predicted_vs_true.png)", ""]
    lines += history_lines(meta)
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def history_lines(meta: dict[str, Any]) -> list[str]:
    """The model's learned-on-node history (each retrain tried on its node), if any."""
    history = meta.get("learning", {}).get("history", [])
    if not history:
        return []
    lines = [
        "## Learned on the node",
        "",
        "| when | node records | families | swapped | current MAE | candidate MAE | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in history:
        figures = entry.get("figures", {})
        at = entry.get("at", "?")
        if isinstance(at, int | float):
            at = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        lines.append(
            f"| {at} | {entry.get('node_records', '?')} "
            f"| {entry.get('families', '?')} | {'yes' if entry.get('swapped') else 'no'} "
            f"| {figures.get('current_mae', float('nan')):.4f} "
            f"| {figures.get('candidate_mae', float('nan')):.4f} "
            f"| {str(entry.get('reason', '')).replace('|', '/')} |"
        )
    return [*lines, ""]


def _cv_coverage(meta: dict[str, Any]) -> str:
    cv = meta.get("cross_validation", {})
    chosen = cv.get("selected", cv.get("forest", {}))
    if "coverage_achieved" not in chosen:
        return ""
    return f", {chosen['coverage_achieved']:.3f} in the training's grouped cross-validation"
