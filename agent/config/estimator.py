"""The retention estimator and the gate on it, and its learning on the node's own run
records."""

from __future__ import annotations

from dataclasses import dataclass

from agent.config.fields import setting


@dataclass(frozen=True, slots=True)
class EstimatorSettings:
    model_dir: str = setting(
        "default",
        "Retention model folder (from `gpushare estimator train`). 'default': the model "
        "shipped with the agent (synthetic training data); 'none': the utilisation-sum rule.",
    )
    profiles_dir: str = setting(
        "/etc/gpushare/profiles", "Folder of workload profiles (*.yaml) requests may name."
    )
    coverage: float = setting(
        0.9,
        "Coverage of the retention gate's conservative estimate: the share of co-locations "
        "whose true retention is at or above it (calibrated in training; a model stores "
        "every level from 0.5 to 0.99).",
        min=0.5,
        max=0.99,
    )
    gate_precision: float = setting(
        0.95,
        "Precision the retention gate is run at: of the co-locations it admits, the share "
        "that keep their floor. The gate admits when P(retention >= floor) reaches the "
        "threshold chosen for this precision in the model's grouped cross-validation (a "
        "model stores thresholds from 0.80 to 0.99).",
        min=0.8,
        max=0.99,
    )
    base_data: str = setting(
        "default",
        "Run records (JSON Lines) the node's own records are added to when the estimator "
        "learns on the node. 'default': the synthetic records the shipped model was trained "
        "on; 'none': the node's records only.",
    )
    retrain_interval_s: float = setting(
        0.0,
        "Seconds between retrains of the retention model on the node's own run records (and "
        "base_data); the new model replaces the current one only when it beats it. 0: off "
        "(`gpushare estimator train --from-node` retrains on demand).",
        min=0.0,
    )
    retrain_min_records: int = setting(
        30,
        "Node run records needed before a retrain is tried.",
        min=1,
    )
    progress_window_s: float = setting(
        10.0,
        "Shortest span of progress reports (ReportProgress) a co-location window must "
        "cover to become a run record.",
        min=0.05,
    )
