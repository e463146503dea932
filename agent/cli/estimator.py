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
def synth(out: str, count: int, seed: int) -> None:
    """Write synthetic run records from the simulated node's contention model."""
    from agent.sim.synth import runs

    records = runs(count, seed=seed)
    Path(out).write_text("".join(to_json(r) + "\n" for r in records))
    click.echo(f"wrote {len(records)} synthetic records to {out}")


@estimator.command(cls=AllRequired)
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Model folder.")
@click.option("--trees", default=100, show_default=True)
@click.option("--folds", default=5, show_default=True, help="Grouped by target workload.")
@click.option("--provenance", default="", help="Where the data came from (stored).")
def train(data: str, out: str, trees: int, folds: int, provenance: str) -> None:
    """Train a Random Forest; print grouped cross-validation next to two baselines."""
    from agent.estimator.training import data_hash, save
    from agent.estimator.training import train as fit

    lines, records = _read(data, need_retention=True)
    click.echo(
        f"training on {len(records)} records, {folds}-fold grouped by workload ...", err=True
    )
    try:
        result = fit(records, folds=folds, trees=trees)
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
    for name, values in result.cv.items():
        click.echo(f"{name:<15}" + "".join(f"{values[k]:>16.4f}" for k in keys))
    click.echo(f"model written to {out}")


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
def predict(model_dir: str, data: str) -> None:
    """Print the records back as JSON Lines, each with predicted_retention and
    retention_lower (the conservative estimate the admission gate uses)."""
    _lines, records = _read(data, need_retention=False)
    model = _load(model_dir)
    mean, lower = model.predict(records)
    for record, m, low in zip(records, mean, lower, strict=True):
        click.echo(to_json(record, predicted_retention=round(m, 6), retention_lower=round(low, 6)))


@estimator.command(cls=AllRequired)
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False))
def evaluate(model_dir: str, data: str) -> None:
    """Metrics of a model on labelled records, as JSON (MAE, RMSE, decision accuracy, and
    the gate's precision and recall at floors 0.8, 0.85 and 0.9)."""
    from agent.estimator.training import gate, scores

    _lines, records = _read(data, need_retention=True)
    model = _load(model_dir)
    mean, lower = model.predict(records)
    truth = [r.retention or 0.0 for r in records]
    click.echo(
        json.dumps({"records": len(records), **scores(truth, mean), **gate(truth, lower)}, indent=2)
    )


def _load(model_dir: str) -> RetentionModel:
    try:
        return RetentionModel.load(Path(model_dir))
    except ValidationError as exc:
        click.echo(f"gpushare: {exc}", err=True)
        sys.exit(exits.CONFIG)
