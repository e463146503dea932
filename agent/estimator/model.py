"""A trained retention model as the agent uses it: compiled forest + metadata, no sklearn."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.errors import ValidationError
from agent.estimator.compiled import CompiledForest
from agent.estimator.features import FEATURE_VERSION, features, set_features
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
        if metadata.get("feature_version") != FEATURE_VERSION:
            raise ValidationError(
                "model",
                f"model features are version "
                f"{metadata.get('feature_version')}, this agent reads "
                f"{FEATURE_VERSION}: retrain it",
            )
        return cls(forest, list(metadata["features"]), metadata)

    def predict(self, records: Sequence[Record]) -> tuple[list[float], list[float]]:
        """Mean and conservative (lower-quantile) retention for each record, in one batch."""
        if not records:
            return [], []
        x = np.asarray([features(r, self.names) for r in records], dtype=np.float64)
        mean, lower = self.forest.predict_with_lower(
            x, quantile=float(self.metadata.get("lower_quantile", 0.1))
        )
        return [float(v) for v in mean], [float(v) for v in lower]

    def predict_set(
        self, gpu_model: str, gpu_memory_bytes: int, workloads: Sequence[Workload]
    ) -> tuple[list[float], list[float]]:
        """``predict`` for every workload of a set next to all the others on one device."""
        if not workloads:
            return [], []
        x = set_features(gpu_model, gpu_memory_bytes, workloads, self.names)
        keys = [row.tobytes() for row in x]
        answers = [self._rows.get(key) for key in keys]
        missing = [at for at, answer in enumerate(answers) if answer is None]
        if missing:
            mean, lower = self.forest.predict_with_lower(
                x[missing], quantile=float(self.metadata.get("lower_quantile", 0.1))
            )
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
