"""A trained retention model as the agent uses it: compiled forest + metadata, no sklearn."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agent.core.errors import ValidationError
from agent.estimator.compiled import CompiledForest
from agent.estimator.features import FEATURE_VERSION, features
from agent.estimator.records import Record

# Built by `python -m agent.sim.default_model` from synthetic data; see its model.json.
DEFAULT_MODEL_DIR = Path(__file__).with_name("default_model")


@dataclass(frozen=True)
class RetentionModel:
    forest: CompiledForest
    names: list[str]
    metadata: dict[str, Any]

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
