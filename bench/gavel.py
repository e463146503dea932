"""What Gavel's measured pair throughputs (K80, P100, V100) show about sharing a GPU.

For every GPU type: how many ordered pairs could not run together at all (0.0: chiefly
they do not fit in memory, the case the memory-space rule refuses up front), and, for the
rest, how much of its solo throughput a job keeps next to another (retention =
co-located / solo) and how often that stays at or above the floors 0.8 and 0.9. Both
synthetic generators (the simulated node's contention model, which trains the default
model, and the interference generator of ``agent.estimator.synthetic``) are summarised the
same way, pairs of two jobs at full threads, per GPU model, side by side: how far the
synthetic worlds are from measured pairs.

    python bench/gavel.py PATH/TO/oracle_throughputs.json   (Gavel's file, MIT licence)
    python bench/gavel.py PATH/TO/simulation_throughputs.json   (single-GPU jobs only)

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.estimator.synthetic import runs as interference
from agent.sim.synth import runs

DEFAULT = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "gavel" / "oracle_throughputs.json"
)


def summarise(values: list[float], unfit: int, total: int) -> dict[str, float]:
    kept = np.asarray(values)
    return {
        "pairs": total,
        "unfit_share": unfit / total,
        "retention_p10": float(np.quantile(kept, 0.1)),
        "retention_median": float(np.median(kept)),
        "at_least_0.8": float(np.mean(kept >= 0.8)),
        "at_least_0.9": float(np.mean(kept >= 0.9)),
    }


def gavel(path: Path) -> dict[str, dict[str, float]]:
    data = json.loads(path.read_text())
    result = {}
    for gpu, jobs in data.items():
        if gpu.endswith("_unconsolidated"):
            continue  # multi-GPU jobs spread over servers: not co-location
        values, unfit, total = [], 0, 0
        for job, entries in jobs.items():
            if job.startswith("(") and not job.endswith(", 1)"):
                continue  # simulation file: only single-GPU jobs share one GPU
            solo = entries.get("null") or 0.0
            for partner, pair in entries.items():
                if partner == "null":
                    continue
                total += 1
                if pair[0] == 0.0 and pair[1] == 0.0:
                    unfit += 1
                elif solo > 0:
                    values.append(min(1.0, pair[0] / solo))
        result[gpu] = summarise(values, unfit, total)
    return result


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/gavel.py PATH/TO/oracle_throughputs.json")
    result = {f"gavel {gpu}": s for gpu, s in gavel(Path(sys.argv[1])).items()}
    for name, records in (
        ("contention", runs(3000, seed=0)),
        ("interference", interference(3000, seed=0)),
    ):
        by_gpu: dict[str, list[float]] = {}
        for r in records:
            if len(r.peers) == 1 and r.target.thread_pct == r.peers[0].thread_pct == 100.0:
                by_gpu.setdefault(r.gpu_model, []).append(r.retention or 0.0)
        for gpu, values in sorted(by_gpu.items()):
            result[f"{name} {gpu}"] = summarise(values, 0, len(values))
    print(f"{'GPU':<34}{'pairs':>7}{'unfit':>8}{'p10':>7}{'median':>8}{'>=0.8':>8}{'>=0.9':>8}")
    for gpu, s in result.items():
        print(
            f"{gpu:<34}{s['pairs']:>7.0f}{s['unfit_share']:>8.1%}{s['retention_p10']:>7.2f}"
            f"{s['retention_median']:>8.2f}{s['at_least_0.8']:>8.1%}{s['at_least_0.9']:>8.1%}"
        )
    print(json.dumps({g: {k: round(v, 4) for k, v in s.items()} for g, s in result.items()}))


if __name__ == "__main__":
    main()
