"""Build the default retention model shipped with the agent (``default_model/``).

    python -m agent.sim.default_model

It is trained on *synthetic* data from the simulated node's contention model (no GPU
measurements were available); its metadata says so, and its grouped cross-validation
figures (leave one family out) are in ``model.json``. Replace it with a model trained on
measurements (``gpushare estimator train``) and point ``estimator.model_dir`` at it.
"""

from __future__ import annotations

from pathlib import Path

from agent.estimator.model import DEFAULT_MODEL_DIR
from agent.estimator.records import to_json
from agent.estimator.training import data_hash, save, train
from agent.sim.synth import PROVENANCE, runs

RUNS, SEED, TREES = 1500, 42, 40


def build(out: Path = DEFAULT_MODEL_DIR) -> None:
    records = runs(RUNS, seed=SEED)
    result = train(records, folds=0, trees=TREES, seed=0)
    save(
        result,
        out,
        data_sha256=data_hash([to_json(r) for r in records]),
        records=len(records),
        provenance=PROVENANCE,
    )


if __name__ == "__main__":
    build()
    print(f"default model written to {DEFAULT_MODEL_DIR}")
