"""What Gavel's measured pair throughputs (K80, P100, V100) show about sharing a GPU.

For every GPU type: how many ordered pairs could not run together at all (0.0: chiefly
they do not fit in memory, the case the memory-space rule refuses up front), and, for the
rest, how much of its solo throughput a job keeps next to another (retention =
co-located / solo) and how often that stays at or above the floors 0.8 and 0.9. The
simulated node's synthetic data is summarised the same way, side by side, to show how far
the synthetic default model's world is from measured pairs.

    python bench/gavel.py PATH/TO/oracle_throughputs.json   (Gavel's file, MIT licence)

Prints a table, then one JSON object on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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
        values, unfit, total = [], 0, 0
        for entries in jobs.values():
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
    result = gavel(Path(sys.argv[1]))
    synthetic = [r.retention or 0.0 for r in runs(2000, seed=0) if len(r.peers) == 1]
    result["synthetic (2 jobs)"] = summarise(synthetic, 0, len(synthetic))
    print(f"{'GPU':<20}{'pairs':>7}{'unfit':>8}{'p10':>7}{'median':>8}{'>=0.8':>8}{'>=0.9':>8}")
    for gpu, s in result.items():
        print(
            f"{gpu:<20}{s['pairs']:>7.0f}{s['unfit_share']:>8.1%}{s['retention_p10']:>7.2f}"
            f"{s['retention_median']:>8.2f}{s['at_least_0.8']:>8.1%}{s['at_least_0.9']:>8.1%}"
        )
    print(json.dumps({g: {k: round(v, 4) for k, v in s.items()} for g, s in result.items()}))


if __name__ == "__main__":
    main()
