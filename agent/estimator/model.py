"""A trained retention model as the agent uses it: compiled forest + metadata, no sklearn.

Its conservative estimate (``retention_lower``) is the calibrated one of
``agent.estimator.calibration`` at the model's coverage (``with_coverage`` picks another
stored level, as the setting ``estimator.coverage`` does); a version 1 model without a
calibration falls back to the 10% quantile of its trees. A model whose forest did not beat
the utilisation-sum rule in cross-validation (``selected: util_sum_rule``) answers with the
rule for both numbers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator.compiled import CompiledForest
from agent.estimator.evaluation import util_sum_rule, util_sum_rule_set
from agent.estimator.features import READABLE_FEATURE_VERSIONS, features, set_features
from agent.estimator.records import Record, Workload

# Built by `python -m agent.sim.default_model` from synthetic data; see its model.json.
DEFAULT_MODEL_DIR = Path(__file__).with_name("default_model")
ROW_CACHE_SIZE = 8192


@dataclass(frozen=True)
class RetentionModel:
    forest: CompiledForest
    names: list[str]
    metadata: dict[str, Any]
    _rows: dict[bytes, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, directory: Path) -> RetentionModel:
        try:
            metadata = json.loads((directory / "model.json").read_text())
            forest = CompiledForest.load(directory / "forest.npz")
        except (OSError, ValueError, KeyError) as exc:
            raise ValidationError("model", f"cannot load a model from {directory}: {exc}") from exc
        if metadata.get("feature_version") not in READABLE_FEATURE_VERSIONS:
            raise ValidationError(
                "model",
                f"model features are version "
                f"{metadata.get('feature_version')}, this agent reads "
                f"{', '.join(map(str, READABLE_FEATURE_VERSIONS))}: retrain it",
            )
        return cls(forest, list(metadata["features"]), metadata)

    @property
    def coverage(self) -> float | None:
        """The stated coverage of ``retention_lower`` (None for a version 1 model)."""
        calibration = self.metadata.get("calibration")
        return float(calibration["coverage"]) if calibration else None

    @property
    def uses_rule(self) -> bool:
        return self.metadata.get("selected") == "util_sum_rule"

    def with_coverage(self, coverage: float) -> RetentionModel:
        """This model with its lower estimate at another coverage (from its stored levels)."""
        calibration = self.metadata.get("calibration")
        if not calibration:
            raise ValidationError("coverage", "this model has no calibration: retrain it")
        try:
            cal.q_at(calibration, coverage)
        except ValueError as exc:
            raise ValidationError("coverage", str(exc)) from exc
        metadata = {**self.metadata, "calibration": {**calibration, "coverage": coverage}}
        return replace(self, metadata=metadata, _rows={})

    def predict(self, records: Sequence[Record]) -> tuple[list[float], list[float]]:
        """Mean and conservative retention for each record, in one batch."""
        if not records:
            return [], []
        if self.uses_rule:
            rule = [util_sum_rule(r) for r in records]
            return rule, list(rule)
        x = np.asarray([features(r, self.names) for r in records], dtype=np.float64)
        mean, lower = self.predict_rows(x)
        return [float(v) for v in mean], [float(v) for v in lower]

    def predict_rows(
        self, x: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Mean and conservative retention for feature rows."""
        calibration = self.metadata.get("calibration")
        if not calibration:
            return self.forest.predict_with_lower(
                x, quantile=float(self.metadata.get("lower_quantile", 0.1))
            )
        mean, spread = self.forest.predict_with_spread(x)
        q = cal.q_at(calibration, float(calibration["coverage"]))
        return mean, cal.lower(mean, spread, q, float(calibration["eps"]), calibration["edges"])

    def predict_set(
        self, gpu_model: str, gpu_memory_bytes: int, workloads: Sequence[Workload]
    ) -> tuple[list[float], list[float]]:
        """``predict`` for every workload of a set next to all the others on one device."""
        if not workloads:
            return [], []
        if self.uses_rule:
            rule = util_sum_rule_set(workloads)
            return [rule] * len(workloads), [rule] * len(workloads)
        x = set_features(gpu_model, gpu_memory_bytes, workloads, self.names)
        keys = [row.tobytes() for row in x]
        answers = [self._rows.get(key) for key in keys]
        missing = [at for at, answer in enumerate(answers) if answer is None]
        if missing:
            mean, lower = self.predict_rows(x[missing])
            for at, m, low in zip(missing, mean, lower, strict=True):
                answers[at] = (float(m), float(low))
                self._remember(keys[at], (float(m), float(low)))
        known = [a for a in answers if a is not None]
        return [a[0] for a in known], [a[1] for a in known]

    def _remember(self, key: bytes, answer: tuple[float, float]) -> None:
        # A feature row's prediction never changes: the same sets recur on a device at
        # every admission attempt, so recent rows are kept (bounded, oldest out first).
        self._rows[key] = answer
        if len(self._rows) > ROW_CACHE_SIZE:
            del self._rows[next(iter(self._rows))]
