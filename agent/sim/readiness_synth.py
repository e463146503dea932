"""Synthetic jobs with the nine admission-time attributes and a readiness label.

SYNTHETIC, and labelled so wherever it is used. Calibrated to one published marginal: in the
Alibaba ASI GPU trace, 52.7% of placed executions never became ready (so 47.3% did); the
intercept is solved so the expected ready share is that number. The attribute mixes and
how each attribute moves readiness are *assumptions* of this generator, not published
figures (docs/replay.md lists them): development sessions, long scheduling waits, busy
nodes, low priority and large requests become ready less often; online inference and
short jobs more often; each machine adds a small effect of its own, so validation grouped
by machine means something.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.estimator.readiness import Row

READY_SHARE = 0.473  # 1 - 0.527: ASI, placed executions that became ready

MODELS = (("A100", 0.35), ("H800", 0.25), ("L20", 0.2), ("A10", 0.2))
PRIORITIES = (("HP", 0.45), ("LP", 0.45), ("Other", 0.10))
JOB_TYPES = (
    ("training", 0.30),
    ("online_inference", 0.25),
    ("offline_inference", 0.15),
    ("dev", 0.20),
    ("other", 0.05),
    ("unknown", 0.05),
)
MODEL_TYPES = (
    ("genai", 0.35),
    ("rec", 0.20),
    ("cv", 0.15),
    ("embedding", 0.10),
    ("dev", 0.10),
    ("unknown", 0.10),
)
GPUS = ((0.25, 0.12), (0.5, 0.15), (0.75, 0.08), (1.0, 0.33), (2.0, 0.12), (4.0, 0.12), (8.0, 0.08))

# Assumed effects on the log-odds of becoming ready.
JOB_EFFECT = {
    "training": 0.3,
    "online_inference": 0.9,
    "offline_inference": 0.4,
    "dev": -1.2,
    "other": -0.3,
    "unknown": -0.6,
}
MODEL_EFFECT = {"genai": -0.2, "rec": 0.4, "cv": 0.3, "embedding": 0.2, "dev": -0.8, "unknown": 0}
PRIORITY_EFFECT = {"HP": 0.5, "LP": -0.4, "Other": 0.0}
ACCELERATOR_EFFECT = {"A100": 0.1, "H800": -0.1, "L20": 0.0, "A10": 0.1}


@dataclass(frozen=True)
class SyntheticJobs:
    rows: list[Row]
    labels: list[bool]
    groups: list[str]
    probabilities: list[float]  # the true P(ready) each label was drawn from


def _pick(rng: np.random.Generator, table: tuple[tuple[object, float], ...], n: int) -> list:  # type: ignore[type-arg]
    values = [v for v, _ in table]
    weights = np.asarray([w for _, w in table])
    return [values[i] for i in rng.choice(len(values), size=n, p=weights / weights.sum())]


def _logit(row: Row, machine_effect: float) -> float:
    job, model = str(row["job_type"]), str(row["model_type"])
    duration_h = float(row["declared_duration_s"]) / 3600.0
    delay_h = float(row["scheduling_delay_s"]) / 3600.0
    value = JOB_EFFECT[job] + MODEL_EFFECT[model] + PRIORITY_EFFECT[str(row["priority"])]
    value += ACCELERATOR_EFFECT[str(row["accelerator_model"])] + machine_effect
    value -= 0.9 * math.log1p(delay_h)  # a long wait: the owner may have given up
    value -= 0.08 * float(row["concurrent_requests"])  # a busy node starts slowly
    value -= 0.12 * float(row["requested_gpus"])  # big jobs fail to start more often
    if job == "dev" and duration_h > 8:
        value -= 0.8  # long-lived notebooks are left idle
    if job == "online_inference" and row["generative"]:
        value += 0.4
    if model == "genai" and float(row["requested_gpus"]) >= 4:
        value -= 0.5  # large model loads time out
    return value


def generate(count: int, *, seed: int, machines: int = 200) -> SyntheticJobs:
    rng = np.random.default_rng(seed)
    machine_effects = rng.normal(0.0, 0.3, machines)
    machine_of = rng.integers(0, machines, count)
    models, priorities = _pick(rng, MODELS, count), _pick(rng, PRIORITIES, count)
    jobs, kinds, gpus = (
        _pick(rng, JOB_TYPES, count),
        _pick(rng, MODEL_TYPES, count),
        _pick(rng, GPUS, count),
    )
    durations = rng.lognormal(math.log(2 * 3600), 1.2, count)
    delays = rng.exponential(900, count) * rng.choice([1, 10], size=count, p=[0.85, 0.15])
    busy = rng.poisson(3, count)
    rows: list[Row] = []
    for i in range(count):
        generative = kinds[i] == "genai" and rng.random() < 0.8
        rows.append(
            {
                "accelerator_model": models[i],
                "priority": priorities[i],
                "job_type": jobs[i],
                "model_type": kinds[i],
                "generative": 1.0 if generative else 0.0,
                "requested_gpus": float(gpus[i]),
                "declared_duration_s": round(float(durations[i]), 1),
                "scheduling_delay_s": round(float(delays[i]), 1),
                "concurrent_requests": float(busy[i]),
            }
        )
    logits = np.asarray(
        [_logit(r, machine_effects[m]) for r, m in zip(rows, machine_of, strict=True)]
    )
    shift = _calibrate(logits, READY_SHARE)
    probabilities = 1.0 / (1.0 + np.exp(-(logits + shift)))
    labels = rng.random(count) < probabilities
    return SyntheticJobs(
        rows,
        [bool(v) for v in labels],
        [f"m{m:04d}" for m in machine_of],
        [float(p) for p in probabilities],
    )


def _calibrate(logits: npt.NDArray[np.float64], share: float) -> float:
    """The intercept that makes the mean probability ``share`` (bisection)."""
    low, high = -20.0, 20.0
    for _ in range(60):
        middle = (low + high) / 2
        if float(np.mean(1.0 / (1.0 + np.exp(-(logits + middle))))) < share:
            low = middle
        else:
            high = middle
    return (low + high) / 2
