"""Replays that measure the agent's decisions the way the readiness paper and the scheduling
article do. Each experiment writes ``docs/replay/<name>.csv``, ``.md`` and ``.png``.

    python bench/replay.py all --openb DIR      # everything, as in docs/replay.md
    python bench/replay.py batch --seeds 2      # one experiment, smaller

``--openb`` is the folder of the Alibaba openb trace (cluster-trace-gpu-v2023/csv of
alibaba/clusterdata); without it the openb parts are skipped and said to be. The last line
is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.admission.policy import Placement
from bench.replays import batch, common, fragmentation, gang, openb, quota

EXPERIMENTS = ("batch", "openb", "fragmentation", "gang", "quota")


def run_batch(args: argparse.Namespace) -> dict[str, Any]:
    rules = list(Placement) if args.sensitivity else [Placement.BEST_FIT]
    results = batch.run(
        openb=args.openb, seeds=args.seeds, trees=args.trees, jobs=args.jobs, rules=rules
    )
    table = batch.summarise(results)
    batch.report(table, args.seeds)
    best = [r for r in table if r["rule"] == "best-fit" and r["load"] > 1.0]
    by = {(r["supply"], r["load"], r["policy"]): r for r in best}
    keys = sorted({(s, lo) for s, lo, _p in by})
    return {
        "predictor_lowers_w_at_every_load_above_1": all(
            by[(s, lo, "predictor")]["W"] < by[(s, lo, "fcfs")]["W"] for s, lo in keys
        ),
        "true_label_best": all(
            by[(s, lo, "true-label")]["W"]
            <= min(by[(s, lo, p)]["W"] for p in batch.POLICIES) + 1e-12
            for s, lo in keys
        ),
        # not significantly lower W: the paired 95% interval reaches zero or above
        "random_no_better_than_fcfs": all(
            by[(s, lo, "random")]["dW_vs_fcfs"] + by[(s, lo, "random")]["dW_ci95"] >= 0
            for s, lo in keys
        ),
        "predictor_gap_captured_mean": round(
            sum(by[(s, lo, "predictor")]["gap_captured"] for s, lo in keys) / len(keys), 3
        ),
    }


def run_fragmentation(args: argparse.Namespace) -> dict[str, Any]:
    table = fragmentation.run(seeds=args.seeds)
    fragmentation.report(table, args.seeds)
    whole = [r for r in table if r["nodes_lost"] == 0]
    return {
        f"{r['rule']}/{r['queue']}": {
            "utilisation": round(r["utilisation"], 3),
            "mean_wait_8gpu_min": round(r["mean_wait_8gpu_min"], 1),
        }
        for r in whole
    }


def run_gang(_args: argparse.Namespace) -> dict[str, Any]:
    results = gang.run()
    gang.report(results)
    return {
        r["mode"]: {"gpu_min_held": r["gpu_min_held"], "gpu_min_useful": r["gpu_min_useful"]}
        for r in results
    }


def run_quota(args: argparse.Namespace) -> dict[str, Any]:
    table, timelines = quota.run(streams=args.streams)
    quota.report(table, timelines, args.streams)
    return {r["policy"]: {k: round(v, 3) for k, v in r.items() if k != "policy"} for r in table}


def run_openb(args: argparse.Namespace) -> dict[str, Any]:
    if args.openb is None:
        print("openb: skipped (no --openb folder)", file=sys.stderr)
        return {"skipped": "no --openb folder"}
    table = openb.run(args.openb)
    openb.report(table)
    return {
        f"{r['rule']}@{r['supply']:g}x{r['speedup']:g}": round(r["admitted_share"], 4)
        for r in table
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=("all", *EXPERIMENTS))
    parser.add_argument("--openb", type=Path, help="folder with the openb CSV files")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trees", type=int, default=40)
    parser.add_argument("--jobs", type=int, default=20_000, help="synthetic pool per seed")
    parser.add_argument("--streams", type=int, default=20, help="random streams (quota)")
    parser.add_argument("--sensitivity", action="store_true", help="also first- and worst-fit")
    parser.add_argument(
        "--out", type=Path, help="write tables and plots here (default docs/replay)"
    )
    args = parser.parse_args()
    if args.openb is not None and not (args.openb / "openb_node_list_gpu_node.csv").is_file():
        parser.error(f"{args.openb} has no openb_node_list_gpu_node.csv")
    if args.out is not None:
        common.OUT = args.out
    chosen = EXPERIMENTS if args.experiment == "all" else (args.experiment,)
    headline: dict[str, Any] = {}
    runners = {
        "batch": run_batch,
        "fragmentation": run_fragmentation,
        "gang": run_gang,
        "quota": run_quota,
        "openb": run_openb,
    }
    for name in chosen:
        started = time.monotonic()
        print(f"{name} ...", file=sys.stderr)
        headline[name] = runners[name](args)
        print(
            f"{name}: {time.monotonic() - started:.1f} s, {common.OUT}/{name}.md", file=sys.stderr
        )
    print(json.dumps(headline))


if __name__ == "__main__":
    main()
