"""``gpushare estimator evaluate``: a model on labelled records, as figures and a report.

``evaluate`` is pure numpy: the metrics (JSON) and the curves a person reads (nominal
against achieved coverage, predicted against true retention, the gate's precision and
recall against the floor next to the utilisation-sum baselines). ``write`` draws them with
matplotlib (imported only here, only when a report is asked for) as PNG files and a Markdown
summary.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator.evaluation import (
    UTIL_SUM_LIMIT,
    baselines,
    gate,
    gate_curve,
    rule_of_sum,
    scores,
    util_sum,
)
from agent.estimator.features import features
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record

CURVE_FLOORS = tuple(round(0.5 + 0.025 * i, 3) for i in range(19))  # 0.5 .. 0.95
PLOTS = ("calibration.png", "predicted_vs_true.png", "gate.png")


def evaluate(model: RetentionModel, records: Sequence[Record]) -> dict[str, Any]:
    truth = np.asarray([r.retention or 0.0 for r in records], dtype=np.float64)
    mean_list, lower_list = model.predict(records)
    mean, lower = np.asarray(mean_list), np.asarray(lower_list)
    metrics: dict[str, Any] = {
        "records": len(records),
        **scores(truth, mean),
        **gate(truth, lower),
        "estimator": "util_sum_rule" if model.uses_rule else "forest",
    }
    curves: dict[str, Any] = {"truth": truth, "mean": mean, "lower": lower}
    calibration = model.metadata.get("calibration")
    if calibration and not model.uses_rule:
        x = np.asarray([features(r, model.names) for r in records], dtype=np.float64)
        m, spread = model.forest.predict_with_spread(x)
        achieved = [
            float(
                np.mean(
                    truth
                    >= cal.lower(
                        m,
                        spread,
                        cal.q_at(calibration, c),
                        calibration["eps"],
                        calibration["edges"],
                    )
                )
            )
            for c in calibration["levels"]
        ]
        metrics["coverage_nominal"] = model.coverage
        metrics["coverage_achieved"] = float(np.mean(truth >= lower))
        curves["nominal"], curves["achieved"] = list(calibration["levels"]), achieved
    sums = np.asarray([util_sum(r) for r in records])
    rule = np.asarray([rule_of_sum(s) for s in sums])
    metrics["baselines"] = baselines(records, truth)
    curves["gate"] = {
        "model": gate_curve(truth, lower, CURVE_FLOORS),
        "util_sum_rule": gate_curve(truth, rule, CURVE_FLOORS),
        f"sum <= {UTIL_SUM_LIMIT:.0f}%": _fixed_curve(truth, sums <= UTIL_SUM_LIMIT),
    }
    return {"metrics": metrics, "curves": curves}


def _fixed_curve(truth: Any, admitted: Any) -> tuple[list[float], list[float]]:
    lower = np.where(admitted, np.inf, -np.inf)
    return gate_curve(truth, lower, CURVE_FLOORS)


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
    fig, (left, right) = plt.subplots(1, 2, figsize=(7.5, 3.4), dpi=80)
    for name, (precision, recall) in curves["gate"].items():
        left.plot(CURVE_FLOORS, precision, label=name)
        right.plot(CURVE_FLOORS, recall, label=name)
    _finish(left, "floor", "precision", "Gate precision")
    _finish(right, "floor", "recall", "Gate recall")
    paths.append(_save(fig, out / PLOTS[2], plt))
    summary = out / "summary.md"
    summary.write_text(markdown(metrics, model, data_name))
    return [*paths, summary]


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
    lines += ["", "| gate | floor | precision | recall |", "|---|---|---|---|"]
    rows = [("model", metrics), *metrics["baselines"].items()]
    for floor in (0.8, 0.85, 0.9):
        for name, values in rows:
            lines.append(
                f"| {name} | {floor} | {values[f'gate_precision_at_{floor}']:.3f} "
                f"| {values[f'gate_recall_at_{floor}']:.3f} |"
            )
    lines += ["", "![gate](gate.png) ![predicted against true](predicted_vs_true.png)", ""]
    return "\n".join(lines)


def _cv_coverage(meta: dict[str, Any]) -> str:
    forest = meta.get("cross_validation", {}).get("forest", {})
    if "coverage_achieved" not in forest:
        return ""
    return f", {forest['coverage_achieved']:.3f} in the training's grouped cross-validation"
