"""Build the default readiness predictor shipped with the agent (``default_readiness/``).

    python -m agent.sim.default_readiness

Trained on *synthetic* jobs (``agent.sim.readiness_synth``, calibrated only to the 47.3%
ready share published for the ASI trace); its metadata says so. Replace it with a model
trained on your own history or an ASI table (``gpushare readiness train``) and point
``readiness.model_dir`` at it.
"""

from __future__ import annotations

from pathlib import Path

from agent.estimator.readiness import DEFAULT_READINESS_DIR
from agent.estimator.readiness_data import Dataset
from agent.estimator.readiness_training import train
from agent.sim.readiness_synth import generate

JOBS, SEED, TREES = 20_000, 42, 40
PROVENANCE = "SYNTHETIC: agent.sim.readiness_synth, 20000 jobs, seed 42"


def build(out: Path = DEFAULT_READINESS_DIR) -> None:
    jobs = generate(JOBS, seed=SEED)
    model = train(Dataset(jobs.rows, jobs.labels, jobs.groups), trees=TREES, provenance=PROVENANCE)
    model.save(out)


if __name__ == "__main__":
    build()
    print(f"default readiness model written to {DEFAULT_READINESS_DIR}")
