"""A trained retention model as the agent uses it: compiled regression + metadata, no
scikit-learn.

Per record it gives ``predicted_retention`` (the regression's estimate: the forest's mean,
or the ridge line's), the explained conservative ``retention_lower`` (calibrated at the
model's coverage; ``with_coverage`` picks another stored level, as the setting
``estimator.coverage`` does) and, at a floor, ``p_keep`` = P(retention >= floor) from the
model's predictive distribution; the gate admits when ``p_keep`` reaches the threshold the
model stores for that floor and the gate's precision (``threshold``). Where training chose
another estimate for the gate to decide on (a one-line rule, the monotone base, the base
with a share of the correction: ``decision``, schema 4), ``p_keep`` and the gate read that
one (``Estimates.gate_mean``), while ``predicted_retention`` and ``retention_lower`` stay
the learned estimate's.

Older models still load: a version 1 model without a calibration falls back to the 10%
quantile of its trees for ``retention_lower``; a model without a stored operating point
(schema 2) gates on ``retention_lower >= floor`` as it did, and says so. A schema 2 model
that chose the utilisation-sum rule (``selected: util_sum_rule``) answers with its forest
anyway: a rule never stands in for the estimate.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from agent.core.errors import ValidationError
from agent.estimator import calibration as cal
from agent.estimator import operating
from agent.estimator.compiled import CompiledForest
from agent.estimator.features import READABLE_FEATURE_VERSIONS, features, set_features
from agent.estimator.linear import LinearModel
from agent.estimator.records import Record, Workload
from agent.estimator.structure import Structure

# Built by `python -m agent.sim.default_model` from synthetic data; see its model.json.
DEFAULT_MODEL_DIR = Path(__file__).with_name("default_model")
ROW_CACHE_SIZE = 8192
FloatArray = npt.NDArray[np.float64]


class Regressor(Protocol):
    def predict_with_spread(self, x: npt.ArrayLike) -> tuple[FloatArray, FloatArray]: ...


@dataclass(frozen=True)
class Estimates:
    """Per row: the estimate, the regression's own doubt (the trees' spread; 0 for a line)
    and the conservative estimate; and what the gate decides on (``decided``, ``doubt``:
    the same as ``mean`` and ``spread`` unless the model's gate decides on another estimate,
    a rule or the monotone base) with the pressure term that weighs most in it (``term``)."""

    mean: FloatArray
    spread: FloatArray
    lower: FloatArray
    decided: FloatArray | None = None
    doubt: FloatArray | None = None
    term: tuple[str, ...] = ()

    @property
    def gate_mean(self) -> FloatArray:
        return self.mean if self.decided is None else self.decided

    @property
    def gate_spread(self) -> FloatArray:
        return self.spread if self.doubt is None else self.doubt


@dataclass(frozen=True)
class RetentionModel:
    regressor: Regressor
    names: list[str]
    metadata: dict[str, Any]
    decision: Structure | None = None
    _rows: dict[bytes, Estimates] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, directory: Path) -> RetentionModel:
        try:
            metadata = json.loads((directory / "model.json").read_text())
            regressor: Regressor
            if metadata.get("regressor") == "linear":
                regressor = LinearModel.from_json(metadata["linear"])
            elif metadata.get("regressor") == "structure":
                regressor = Structure.from_json(
                    metadata["structure"], metadata["features"], directory
                )
            else:
                regressor = CompiledForest.load(directory / "forest.npz")
            decision = None
            if metadata.get("decision"):
                decision = Structure.from_json(
                    metadata["decision"], metadata["features"], directory
                )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValidationError("model", f"cannot load a model from {directory}: {exc}") from exc
        if metadata.get("feature_version") not in READABLE_FEATURE_VERSIONS:
            raise ValidationError(
                "model",
                f"model features are version "
                f"{metadata.get('feature_version')}, this agent reads "
                f"{', '.join(map(str, READABLE_FEATURE_VERSIONS))}: retrain it",
            )
        return cls(regressor, list(metadata["features"]), metadata, decision)

    @property
    def kind(self) -> str:
        return str(self.metadata.get("regressor", "forest"))

    @property
    def decides_on(self) -> str:
        """The estimate the gate decides on: ``rule:<term>``, ``base``, ``corrected`` or
        ``corrected_p_keep`` (the structure's), else the model's own estimate."""
        return self.decision.mode if self.decision is not None else self.kind

    @property
    def coverage(self) -> float | None:
        """The stated coverage of ``retention_lower`` (None for a version 1 model)."""
        calibration = self.metadata.get("calibration")
        return float(calibration["coverage"]) if calibration else None

    @property
    def has_operating_point(self) -> bool:
        return bool(self.metadata.get("gate")) and bool(self.metadata.get("predictive"))

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
        x = np.asarray([features(r, self.names) for r in records], dtype=np.float64)
        found = self._estimate_rows(x)
        return [float(v) for v in found.mean], [float(v) for v in found.lower]

    def estimate(self, records: Sequence[Record]) -> Estimates:
        x = np.asarray([features(r, self.names) for r in records], dtype=np.float64)
        return self.estimate_rows(x)

    def estimate_rows(self, x: npt.ArrayLike) -> Estimates:
        found = self._estimate_rows(x)
        if self.decision is None:
            return found
        decided, doubt = self.decision.predict_with_spread(x)
        term = tuple(self.decision.base.driving_terms(x, self.names))
        return replace(found, decided=decided, doubt=doubt, term=term)

    def _estimate_rows(self, x: npt.ArrayLike) -> Estimates:
        calibration = self.metadata.get("calibration")
        if not calibration and isinstance(self.regressor, CompiledForest):
            quantile = float(self.metadata.get("lower_quantile", 0.1))
            mean, lower = self.regressor.predict_with_lower(x, quantile=quantile)
            return Estimates(mean, self.regressor.predict_with_spread(x)[1], lower)
        mean, spread = self.regressor.predict_with_spread(x)
        if not calibration:
            return Estimates(mean, spread, mean)
        q = cal.q_at(calibration, float(calibration["coverage"]))
        lower = cal.lower(mean, spread, q, float(calibration["eps"]), calibration["edges"])
        return Estimates(mean, spread, lower)

    def predict_rows(self, x: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """Mean and conservative retention for feature rows (not what the gate decides on)."""
        found = self._estimate_rows(x)
        return found.mean, found.lower

    def p_keep(
        self, mean: npt.ArrayLike, spread: npt.ArrayLike, floor: npt.ArrayLike
    ) -> FloatArray:
        """P(retention >= floor) for estimates (``floor``: one, or one per row); a model
        without a predictive distribution answers 1 where ``mean`` meets the floor, else 0."""
        predictive = self.metadata.get("predictive")
        if not predictive:
            result: FloatArray = (
                np.asarray(mean, dtype=np.float64) >= np.asarray(floor, dtype=np.float64)
            ).astype(np.float64)
            return result
        return operating.p_keep(mean, spread, floor, predictive["q"], float(predictive["eps"]))

    def threshold(self, floor: float, precision: float) -> float | None:
        """The least ``p_keep`` the gate admits at this floor and precision (None: it admits
        nothing there)."""
        gate = self.metadata.get("gate")
        if not gate:
            return 0.5
        return operating.threshold_at(gate, floor, precision)

    def gate_admits(
        self, records: Sequence[Record], floor: float, precision: float
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """``p_keep`` at ``floor`` and the gate's decision, for each record."""
        return self.admits(self.estimate(records), floor, precision)

    def admits(
        self, found: Estimates, floor: float, precision: float
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """``gate_admits`` for estimates already made."""
        if not self.has_operating_point:
            p = (found.lower >= floor).astype(np.float64)
            return p, p >= 0.5
        p = self.p_keep(found.gate_mean, found.gate_spread, floor)
        return p, operating.admitted(p, self.threshold(floor, precision))

    def estimate_set(
        self, gpu_model: str, gpu_memory_bytes: int, workloads: Sequence[Workload]
    ) -> Estimates:
        """``estimate`` for every workload of a set next to all the others on one device."""
        x = set_features(gpu_model, gpu_memory_bytes, workloads, self.names)
        keys = [row.tobytes() for row in x]
        rows = [self._rows.get(key) for key in keys]
        missing = [at for at, row in enumerate(rows) if row is None]
        if missing:
            found = self.estimate_rows(x[missing])
            for i, at in enumerate(missing):
                rows[at] = _row(found, i)
                self._remember(keys[at], _row(found, i))
        return _stack([row for row in rows if row is not None])

    def predict_set(
        self, gpu_model: str, gpu_memory_bytes: int, workloads: Sequence[Workload]
    ) -> tuple[list[float], list[float]]:
        """``predict`` for every workload of a set next to all the others on one device."""
        if not workloads:
            return [], []
        found = self.estimate_set(gpu_model, gpu_memory_bytes, workloads)
        return [float(v) for v in found.mean], [float(v) for v in found.lower]

    def _remember(self, key: bytes, answer: Estimates) -> None:
        # A feature row's prediction never changes: the same sets recur on a device at
        # every admission attempt, so recent rows are kept (bounded, oldest out first).
        self._rows[key] = answer
        if len(self._rows) > ROW_CACHE_SIZE:
            del self._rows[next(iter(self._rows))]


def _row(found: Estimates, at: int) -> Estimates:
    def pick(values: FloatArray | None) -> FloatArray | None:
        return None if values is None else values[at : at + 1]

    term = found.term[at : at + 1]
    mean, spread, lower = (
        found.mean[at : at + 1],
        found.spread[at : at + 1],
        found.lower[at : at + 1],
    )
    return Estimates(mean, spread, lower, pick(found.decided), pick(found.doubt), term)


def _stack(rows: Sequence[Estimates]) -> Estimates:
    def joined(values: Sequence[FloatArray | None]) -> FloatArray | None:
        present = [v for v in values if v is not None]
        return np.concatenate(present) if len(present) == len(values) else None

    return Estimates(
        np.concatenate([r.mean for r in rows]),
        np.concatenate([r.spread for r in rows]),
        np.concatenate([r.lower for r in rows]),
        joined([r.decided for r in rows]),
        joined([r.doubt for r in rows]),
        tuple(t for r in rows for t in r.term),
    )
