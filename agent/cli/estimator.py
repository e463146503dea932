"""``gpushare estimator``: make data, train, predict and evaluate the retention estimator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from agent.cli import exits
from agent.cli.common import AllRequired
from agent.core.errors import ValidationError
from agent.estimator.model import RetentionModel
from agent.estimator.records import Record, parse_lines, to_json


def _read(path: str, *, need_retention: bool) -> tuple[list[str], list[Record]]:
    try:
        lines = Path(path).read_text().splitlines()
        return lines, parse_lines(lines, need_retention=need_retention)
    except OSError as exc:
        click.echo(f"gpushare: cannot read {path}: {exc.strerror}", err=True)
        sys.exit(exits.CONFIG)
    except ValidationError as exc:
        click.echo(f"gpushare: {path}: {exc}", err=True)
        sys.exit(exits.CONFIG)


@click.group()
def estimator() -> None:
    """The retention estimator: how much of its solo speed a workload keeps when shared."""


@estimator.command(cls=AllRequired)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="JSON Lines file.")
@click.option("--runs", "count", default=2000, show_default=True, help="Co-location sets.")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--generator",
    type=click.Choice(["contention", "interference"]),
    default="contention",
    show_default=True,
    help="contention: the simulated node's model; interference: a second one with other "
    "physics and nvidia-smi counters only (to test on a world the model has not seen).",
)
def synth(out: str, count: int, seed: int, generator: str) -> None:
    """Write synthetic run records."""
    from agent.estimator import synthetic
    from agent.sim import synth

    records = (synth.runs if generator == "contention" else synthetic.runs)(count, seed=seed)
    Path(out).write_text("".join(to_json(r) + "\n" for r in records))
    click.echo(f"wrote {len(records)} synthetic records ({generator}) to {out}")


@estimator.command(cls=AllRequired)
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Model folder.")
@click.option("--trees", default=100, show_default=True)
@click.option(
    "--folds",
    default=0,
    show_default=True,
    help="Cross-validation folds grouped by workload family; 0: leave one family out.",
)
@click.option(
    "--coverage",
    default=0.9,
    show_default=True,
    type=click.FloatRange(0.5, 0.99),
    help="Stated coverage of retention_lower (the gate's; estimator.coverage overrides).",
)
@click.option("--provenance", default="", help="Where the data came from (stored).")
def train(data: str, out: str, trees: int, folds: int, coverage: float, provenance: str) -> None:
    """Train a Random Forest; print grouped cross-validation next to the baselines."""
    from agent.estimator.training import data_hash, save
    from agent.estimator.training import train as fit

    lines, records = _read(data, need_retention=True)
    how = f"{folds}-fold" if folds else "leave-one-family-out"
    click.echo(f"training on {len(records)} records, {how} cross-validation ...", err=True)
    try:
        result = fit(records, folds=folds, trees=trees, coverage=coverage)
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
    save(
        result,
        Path(out),
        data_sha256=data_hash(lines),
        records=len(records),
        provenance=provenance or data,
    )
    keys = ["mae", "rmse", "accuracy_at_0.8", "accuracy_at_0.9"]
    click.echo(f"{'model':<15}" + "".join(f"{k:>16}" for k in keys))
    for name in ("forest", "mean", "util_sum_rule"):
        click.echo(f"{name:<15}" + "".join(f"{result.cv[name][k]:>16.4f}" for k in keys))
    click.echo(f"{'gate @0.85':<15}{'precision':>16}{'recall':>16}")
    for name in ("forest", "util_sum_rule", "util_sum_120", "forest_tree_q10"):
        values = result.cv[name]
        click.echo(
            f"{name:<15}{values['gate_precision_at_0.85']:>16.4f}"
            f"{values['gate_recall_at_0.85']:>16.4f}"
        )
    forest = result.cv["forest"]
    click.echo(
        f"retention_lower coverage: nominal {forest['coverage_nominal']:.2f}, achieved "
        f"{forest['coverage_achieved']:.4f} on held-out families"
    )
    winning = result.calibration["levels_beating_rule"]
    if result.selected != "forest":
        click.echo(
            "the forest's gate does not beat 'sum of solo gpu_util <= 120%' at floor 0.85 at "
            "any coverage: the model answers with the utilisation-sum rule"
        )
    else:
        click.echo(
            f"at floor 0.85 the forest's gate beats 'sum of solo gpu_util <= 120%' on "
            f"precision and recall at {len(winning)} of the 50 coverages from "
            f"{winning[0]:.2f} to {winning[-1]:.2f}"
        )
    click.echo(f"model written to {out}")


COVERAGE = click.option(
    "--coverage",
    type=click.FloatRange(0.5, 0.99),
    default=None,
    help="Coverage of retention_lower (default: the model's).",
)


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@COVERAGE
def predict(model_dir: str, data: str, coverage: float | None) -> None:
    """Print the records back as JSON Lines, each with predicted_retention,
    retention_lower (the conservative estimate the admission gate uses) and its coverage."""
    _lines, records = _read(data, need_retention=False)
    model = _load(model_dir, coverage)
    mean, lower = model.predict(records)
    extra = {} if model.coverage is None else {"retention_coverage": model.coverage}
    for record, m, low in zip(records, mean, lower, strict=True):
        click.echo(
            to_json(record, predicted_retention=round(m, 6), retention_lower=round(low, 6), **extra)
        )


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@COVERAGE
@click.option(
    "--report",
    type=click.Path(file_okay=False),
    default=None,
    help="Also write plots (PNG) and summary.md into this folder (needs matplotlib).",
)
def evaluate(model_dir: str, data: str, coverage: float | None, report: str | None) -> None:
    """Metrics of a model on labelled records, as JSON: MAE, RMSE, decision accuracy, the
    gate's precision and recall at floors 0.8, 0.85 and 0.9, the coverage of retention_lower
    (nominal and achieved) and the utilisation-sum baselines."""
    from agent.estimator.report import evaluate as run
    from agent.estimator.report import write

    _lines, records = _read(data, need_retention=True)
    model = _load(model_dir, coverage)
    result = run(model, records)
    if report is not None:
        try:
            written = write(Path(report), result, model, Path(data).name)
        except ValidationError as exc:
            click.echo(f"gpushare: {exc}", err=True)
            sys.exit(exits.CONFIG)
        click.echo(f"report written to {', '.join(str(p) for p in written)}", err=True)
    click.echo(json.dumps(result["metrics"], indent=2))


def _load(model_dir: str, coverage: float | None = None) -> RetentionModel:
    try:
        model = RetentionModel.load(Path(model_dir))
        return model if coverage is None else model.with_coverage(coverage)
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
